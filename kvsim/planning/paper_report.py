"""The report of `run_paper`: our measurements beside the vLLM paper's published findings, with each
difference explained. The published figures below are quoted from the paper's text (Kwon et al.,
"Efficient Memory Management for Large Language Model Serving with PagedAttention", SOSP'23)."""

from __future__ import annotations

import pandas as pd

from kvsim.planning import figures
from kvsim.planning.paper import KNEE_FACTOR, SETUPS, SYSTEMS, PaperResults
from kvsim.planning.report import Report

#: Published findings, quoted (section numbers of the paper).
PUBLISHED = {
    "capacity": "On ShareGPT, vLLM sustains 1.7x-2.7x higher request rates than Orca (Oracle) and 2.7x-8x "
                "higher than Orca (Max) at similar latencies, and up to 22x higher than FasterTransformer "
                "(section 6.2). Alpaca follows the same trend except OPT-175B, where vLLM's advantage over "
                "Orca (Oracle) and (Pow2) is smaller: that deployment has a large KV memory and Alpaca's "
                "sequences are short, so the runs are compute-bound rather than memory-bound.",
    "batch": "For OPT-13B on ShareGPT, vLLM batches 2.2x more requests than Orca (Oracle) and 4.3x more "
             "than Orca (Max) (section 6.2, Fig. 13a).",
    "memory": "In existing systems only 20.4%-38.2% of the KV cache holds token states (section 1, Fig. 2); "
              "vLLM wastes under 4% (section 4.2: at most one partly filled block per sequence).",
    "block": "Block sizes 16 to 128 perform best on ShareGPT; on Alpaca 16 and 32 work well and larger "
             "blocks are markedly worse, as sequences become shorter than a block; vLLM's default is 16 "
             "(section 7.2). The paged attention kernel is 20-26% slower than FasterTransformer's (7.1).",
    "swap": "Swapping costs more than recomputation at small block sizes (many small PCIe transfers), "
            "recomputation's cost does not depend on the block size, and from block size 16 to 64 the two "
            "give comparable end-to-end performance (section 7.3).",
}

SHORT = {"vLLM (paged)": "paged", "Orca (Oracle)": "oracle", "Orca (Pow2)": "pow2", "Orca (Max)": "max",
         "FasterTransformer (static)": "static"}


def _capacity_words(v: float, lowest: float) -> float | str:
    """A capacity of 0 means no rate tried was sustained: say so, with the lowest rate tried."""
    return f"none (< {lowest:g})" if v == 0 else v


def _ratio_table(caps: pd.DataFrame, curves: pd.DataFrame | None = None) -> pd.DataFrame:
    rows = []
    for (setup, preset), g in caps.groupby(["setup", "preset"], sort=False):
        c = dict(zip(g.system, g.capacity_rps))
        ref = c.get("Orca (Max)", 0.0)
        row = {"setup": setup, "trace": preset}
        tried = (curves[(curves.setup == setup) & (curves.preset == preset)].rate if curves is not None
                 else pd.Series(dtype=float))
        lowest = float(tried.min()) if len(tried) else float("nan")
        row.update({f"{SHORT.get(n, n)} (req/s)": _capacity_words(v, lowest) for n, v in c.items()})
        fmt = lambda n: "-" if not ref else f"{c.get(n, 0.0) / ref:.2f}"  # noqa: E731
        row["paged : oracle : pow2 : max"] = " : ".join(fmt(n) for n in list(SYSTEMS)[:4])
        row["paged / oracle"] = c["vLLM (paged)"] / c["Orca (Oracle)"] if c.get("Orca (Oracle)") else float("nan")
        rows.append(row)
    return pd.DataFrame(rows)


def _at_rate(r: PaperResults) -> pd.DataFrame:
    """Rows of the main profile at each (setup, preset)'s table rate."""
    parts = []
    main = r.curves[r.curves.profile == (r.profile or "default")]
    for (setup, preset), rate in r.plan.table_rate.items():
        if setup in r.plan.setups:
            parts.append(main[(main.setup == setup) & (main.preset == preset) & (main.rate == rate)])
    return pd.concat(parts, ignore_index=True)


def paper_report(r: PaperResults, title: str = "The vLLM paper's experiments in kvsim") -> Report:
    """Every section of the paper run: measurements, the published finding, and the differences."""
    rep = Report(title)
    plan = r.plan
    rep.heading("Setup")
    profile_text = (f"Every run uses the `{r.profile}` engine profile (the paper's engine); paged runs under "
                    f"`{r.side_profile}` are shown beside it." if r.profile else
                    "kvsim has no engine profiles yet (`--engine-profile` not built), so every run uses "
                    "the kernel-only cost model: no CPU time per step, and prefill mixed with decode in a "
                    "step (Orca-style). The paper's 2023 vLLM ran prompt steps apart from decode steps.")
    rep.paragraph(f"Deployments of the paper's Table 1: "
                  + "; ".join(f"{s}: {SETUPS[s]['tp']} x {SETUPS[s]['gpu']}, {SETUPS[s]['kv_gib']} GiB KV"
                              for s in plan.setups)
                  + f". Poisson traces of {plan.duration_s:g} s per rate (the paper used one hour, 15 min for "
                  f"OPT-175B): shorter traces soften the latency explosion past capacity but keep the knee. "
                  + profile_text
                  + f" A system's capacity is the rate where its normalized latency first exceeds "
                  f"{KNEE_FACTOR:g}x the lowest latency at the lowest rate (interpolated). "
                  f"Wall time of this run: {r.wall_s:.0f} s.")

    rep.heading("Capacity: normalized latency against request rate")
    ratios = _ratio_table(r.capacities, r.curves)
    rep.table("capacity", ratios, "capacity (req/s) per system and the ratio paged : oracle : pow2 : max "
                                  "(Orca Max = 1); none (< R): not sustained even at R, the lowest rate tried")
    rep.paragraph("**Published:** " + PUBLISHED["capacity"])
    for (setup, preset), g in r.curves.groupby(["setup", "preset"], sort=False):
        rep.figure(f"latency_{setup}_{preset}".lower().replace("-", ""), figures.latency_vs_rate(
            g, rate="rate", title=f"{setup}, {preset}-like", ymax=1.0))
    curves = r.curves.pivot_table(index=["setup", "preset", "rate"], columns="system",
                                  values="normalized_latency_s_per_token", sort=False).reset_index()
    setups, presets = list(dict.fromkeys(r.curves.setup)), list(dict.fromkeys(r.curves.preset))
    curves = curves.assign(_s=curves.setup.map(setups.index), _p=curves.preset.map(presets.index))
    curves = curves.sort_values(["_s", "_p", "rate"]).drop(columns=["_s", "_p"])
    rep.table("curves", curves, "normalized latency (s/token) per rate")

    at = _at_rate(r)
    rep.heading("Memory breakdown and batched requests per system")
    rep.paragraph("At one rate per setup and trace ("
                  + ", ".join(f"{s} {p} {v:g} req/s" for (s, p), v in plan.table_rate.items() if s in plan.setups)
                  + "; the paper's Fig. 13 used OPT-13B at 2 req/s on ShareGPT and 30 req/s on Alpaca). "
                  "KV fractions are time averages over the run.")
    cols = {"mean_batch_size": "mean batch", "kv_mean_fraction_token_states": "token states",
            "kv_mean_fraction_reserved": "reserved", "kv_mean_fraction_internal_fragmentation": "internal",
            "kv_mean_fraction_external_fragmentation": "external", "kv_mean_fraction_free": "free",
            "preemptions": "preemptions"}
    tab = at[["setup", "preset", "rate", "system", *cols]].rename(columns=cols)
    rep.table("breakdown", tab)
    for preset in ("sharegpt", "alpaca"):
        g = at[(at.setup == plan.setups[0]) & (at.preset == preset)]
        if g.empty:
            continue
        rep.figure(f"breakdown_{preset}", figures.memory_breakdown(
            {s: {c: row[f"kv_mean_fraction_{c}"] for c in figures.CATEGORIES} for s, (_, row) in
             zip(g.system, g.iterrows())}, title=f"{plan.setups[0]}, {preset}-like at {g.rate.iloc[0]:g} req/s"))
        rep.figure(f"batch_{preset}", figures.bars(dict(zip(g.system, g.mean_batch_size)),
                                                   "mean batch (requests)",
                                                   f"Mean batched requests, {preset}-like"))
    rep.paragraph("**Published:** " + PUBLISHED["batch"] + " " + PUBLISHED["memory"])

    rep.heading("Block size")
    rep.figure("block_size", figures.lines(r.blocks, "block_size", "normalized_latency_s_per_token", "preset",
                                           "block size (tokens)", "normalized latency (s/token)",
                                           "OPT-13B, paged: latency against block size", logx=True))
    rep.table("block_size", r.blocks[["preset", "rate", "block_size", "normalized_latency_s_per_token",
                                      "mean_batch_size", "preemptions", "kv_mean_fraction_internal_fragmentation"]])
    rep.paragraph("**Published:** " + PUBLISHED["block"])

    rep.heading("Recompute against swap")
    rep.figure("swap", figures.lines(r.swap, "block_size", "normalized_latency_s_per_token", "preemption",
                                     "block size (tokens)", "normalized latency (s/token)",
                                     f"OPT-13B, ShareGPT-like at {plan.swap_rate:g} req/s", logx=True))
    swap_cols = [c for c in ("preemption", "block_size", "normalized_latency_s_per_token", "preemptions",
                             "swap_swap_outs", "swap_time_s", "recomputed_tokens") if c in r.swap]
    rep.table("swap", r.swap[swap_cols])
    rep.paragraph("**Published:** " + PUBLISHED["swap"])
    rep.heading("Where we differ from the paper, and why")
    rep.paragraph(differences(r, ratios))
    return rep


def differences(r: PaperResults, ratios: pd.DataFrame) -> str:
    """The differences in words, with our numbers."""
    lines = []
    share = ratios[ratios.trace == "sharegpt"]
    if len(share):
        po = share["paged / oracle"]
        lines.append(f"- Paged over oracle on ShareGPT-like: {po.min():.2f}x to {po.max():.2f}x here against "
                     "1.7x-2.7x published. kvsim's Orca baselines reserve memory with a buddy allocator and "
                     "admit strictly first come first served, as the paper describes; the capacity definition "
                     f"(latency {KNEE_FACTOR:g}x the unloaded one) and the short traces move each knee, and "
                     "kvsim's cost model is a roofline, not the paper's measured GPUs.")
    below = ratios[ratios["paged / oracle"] < 1]
    for _, row in below.iterrows():
        at = _at_rate(r)
        g = at[(at.setup == row["setup"]) & (at.preset == row["trace"])].set_index("system")
        free = g.kv_mean_fraction_free.get("vLLM (paged)", float("nan"))
        lines.append(f"- {row['setup']} on {row['trace']}-like: paged reaches {row['paged / oracle']:.2f}x of "
                     f"oracle's capacity. The KV cache is far larger than this compute can use "
                     f"({100 * free:.0f}% of it free under paged at the table rate), so memory limits neither "
                     "system and paged's slower attention kernel (the cost model's 1.23x at block 16) costs "
                     "it a little; the paper saw its advantage shrink here for the same reason "
                     "(compute-bound), not reverse.")
    if r.profile is None:
        lines.append("- No engine profile: without per-step CPU time and with prefill mixed into decode "
                     "steps, every system's steps are cheaper than on the paper's engine, so absolute "
                     "rates are higher than the paper's; ratios between systems are less affected because "
                     "all systems share the cost model.")
    lines.append("- Swap: kvsim times a swap as bytes / PCIe bandwidth with no cost per transfer, so swapping "
                 "does not get worse at small block sizes as the paper measured (its swap moved each block "
                 "with its own copy). Our recompute-against-swap curve therefore shows the memory effect "
                 "only.")
    lines.append("- Block size: kvsim's paged-kernel penalty is 1.17 + 1/block_size (the paper's 20-26% at "
                 "block 16, steeper below), so very small blocks lose by the kernel model and large blocks "
                 "by internal fragmentation, the two forces the paper names; the exact optimum depends on "
                 "that fitted curve.")
    lines.append("- Static batching (FasterTransformer) here forms a batch only when none runs and holds it "
                 "until its longest request ends; the paper's FasterTransformer also used a maximum batch "
                 "size and its own kernels, so its gap to vLLM differs in size.")
    return "\n".join(lines)
