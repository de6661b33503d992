"""Capacity-planning reports: from a trace and a deployment (runs the systems, a rate sweep and the
block-size tuner), or from a sweep table (`kvsim sweep` output). Both return a `Report` to write with
`write_report`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import pandas as pd

from kvsim.planning import run_cache
from kvsim.planning.reports import figures
from kvsim.planning.reports.metric_labels import value_label
from kvsim.planning.reports.document import Report
from kvsim.planning.runs import SYSTEMS, make_config
from kvsim.planning.sweep.runner import run_sweep
from kvsim.planning.tune import tune_block_size
from kvsim.engine.sim import simulate
from kvsim.trace.table import Trace

#: Columns of the per-system table (summary_row names) and their headers.
SYSTEM_COLUMNS = {
    "throughput_rps": "req/s", "throughput_tokens_per_s": "tokens/s", "mean_batch_size": "mean batch",
    "normalized_latency_s_per_token": "norm. latency (s/token)", "ttft_s_p99": "TTFT p99 (s)",
    "preemptions": "preemptions", "kv_mean_fraction_token_states": "KV token states",
    "kv_mean_fraction_reserved": "KV reserved", "kv_mean_fraction_internal_fragmentation": "KV internal",
    "kv_mean_fraction_external_fragmentation": "KV external", "kv_mean_fraction_free": "KV free",
}


def _flat(summary: dict) -> dict:
    from kvsim.planning.runs import summary_row
    return summary_row(summary)


def workload_table(trace: Trace) -> pd.DataFrame:
    """Requests, rate and length statistics (tokens) of a trace, one row."""
    s = trace.summary()
    return pd.DataFrame([{
        "requests": s["requests"], "duration (s)": s["duration_s"], "rate (req/s)": s["rate_rps"],
        "prompt mean": s["prompt_tokens"]["mean"], "prompt p99": s["prompt_tokens"]["p99"],
        "output mean": s["output_tokens"]["mean"], "output p99": s["output_tokens"]["p99"]}])


def systems_section(report: Report, trace: Trace, flags: dict, systems: dict[str, dict] = SYSTEMS) -> dict:
    """Run every system on `trace` at its own arrivals; add the table and the memory breakdown, timeline,
    batch and preemption figures. Returns the summaries by system."""
    from kvsim.planning.progress_lines import say
    results = {}
    for k, (name, extra) in enumerate(systems.items()):
        say(f"report: system {k + 1} of {len(systems)}: {name} at the trace's arrivals")
        results[name] = simulate(trace, make_config(**{**flags, **extra}))
    summaries = {name: r.summary for name, r in results.items()}
    for name, extra in systems.items():          # the tuner's run at the same block size is this one
        run_cache.keep_run({**flags, **extra}, trace, results[name].summary)
    rows = []
    for name, s in summaries.items():
        flat = _flat(s)
        rows.append({"system": name, **{v: flat.get(k) for k, v in SYSTEM_COLUMNS.items()}})
    report.heading("Systems at the trace's arrival times")
    report.paragraph("Each system replays the same requests. KV columns are time-averaged shares of the "
                     "KV capacity (they sum to 100%); normalized latency is end-to-end latency over output "
                     "tokens, averaged over requests.")
    report.table("systems", pd.DataFrame(rows), percent=[v for k, v in SYSTEM_COLUMNS.items() if "fraction" in k])
    report.figure("memory_breakdown", figures.memory_breakdown(
        {n: s["kv"]["mean_fraction"] for n, s in summaries.items()}))
    report.figure("timeline", figures.timeline(
        {n: r.steps for n, r in results.items()},
        {n: s["kv"]["capacity_tokens"] for n, s in summaries.items()}))
    groups = figures.group_timeline({n: r.steps for n, r in results.items()},
                                    {n: s["kv"].get("groups", ()) for n, s in summaries.items()})
    if groups is not None:       # hybrid / Jenga runs: which group holds the memory, what windows free
        report.figure("kv_groups", groups)
    report.figure("batch", figures.bars({n: s["mean_batch_size"] for n, s in summaries.items()},
                                        "mean batch (requests)", "Mean batched requests per system"))
    preemptions_figure(report, {n: s["preemptions"] for n, s in summaries.items()})
    return summaries


def preemptions_figure(report: Report, counts: dict) -> None:
    """Preemptions per system as bars, or a sentence when there were none (no empty chart)."""
    if any(counts.values()):
        report.figure("preemptions", figures.preemptions(counts))
    else:
        report.paragraph(f"No preemptions in any of the {len(counts)} runs: the KV cache never ran out.")


#: The block-size curve's columns shown on a report page (all go to the CSV), with short headers.
BLOCK_SIZE_SHOW = {"block_size": "block", "waste_fraction": "waste", "mean_batch_size": "mean batch",
                   "throughput_tokens_per_s": "tokens/s", "gather_fraction": "gather",
                   "bookkeeping_fraction": "bookkeeping", "capacity_tokens_per_s": "capacity (tokens/s)",
                   "latency_s_per_token": "latency (s/token)", "preemptions": "preemptions"}


def block_size_table(report: Report, name: str, curve: pd.DataFrame) -> None:
    """The tuner's curve: every column in `data/<name>.csv`, the ones that decide on the page."""
    show = {k: v for k, v in BLOCK_SIZE_SHOW.items() if k in curve}
    report.table(name, curve, "waste: reserved + internal fragmentation, % of allocated KV; gather and "
                 "bookkeeping: % of a decode step; capacity: tokens/s with the queue full, corrected for "
                 "bookkeeping; every column in the CSV", show=show)


def rate_section(report: Report, trace: Trace, flags: dict, rates: Sequence[float],
                 systems: dict[str, dict] = SYSTEMS, workers: int | None = 1) -> pd.DataFrame:
    """Latency against request rate per system (the trace's arrivals rescaled to each rate)."""
    from kvsim.planning.progress_lines import say
    frames = []
    for k, (name, extra) in enumerate(systems.items()):
        say(f"report: latency against rate, system {k + 1} of {len(systems)}: {name}, {len(rates)} rates")
        df = run_sweep({"rate": list(rates)}, base={**flags, **extra}, trace=trace, workers=workers, progress=True)
        frames.append(df.assign(system=name))
    df = pd.concat(frames, ignore_index=True)
    ok = df[df.status == "ok"]
    report.heading("Latency against request rate")
    report.paragraph("The trace's arrival times are rescaled to each rate (same requests, same order). "
                     "A system's capacity is the rate where its curve turns up.")
    report.figure("latency_vs_rate", figures.latency_vs_rate(ok, rate="rate"))
    table = ok.pivot_table(index="rate", columns="system", values="normalized_latency_s_per_token",
                           sort=False).reset_index()
    report.table("latency_vs_rate", table, "normalized latency (s/token) by rate (req/s)")
    return df


def block_size_section(report: Report, trace: Trace, flags: dict, block_sizes: Sequence[int] | None,
                       workers: int | None = 1, bookkeeping=None):
    """The tuner's curve and recommendation."""
    r = tune_block_size(trace, block_sizes=block_sizes, bookkeeping=bookkeeping, workers=workers, **flags)
    report.heading("Block size")
    from kvsim.planning.tune import TOLERANCE
    from kvsim.planning.tune_notes import headline
    line = headline(r.curve, r.recommended, r.good_range, TOLERANCE)
    report.paragraph(f"**{line[0].upper() + line[1:]}.** {r.reason}")
    if r.warnings:                     # sizes the kernel cannot run: said on the page and on stderr
        from kvsim.planning.progress_lines import say
        report.paragraph("Not runnable on this engine: " + "; ".join(r.warnings) + ".")
        for warning in r.warnings:
            say(f"warning: {warning}")
    report.figure("block_size", figures.block_size_curve(r.curve, recommended=r.recommended))
    block_size_table(report, "block_size", r.curve)
    return r


def trace_report(trace: Trace, title: str = "", *, rates: Sequence[float] | None = None,
                 block_sizes: Sequence[int] | None = None, workers: int | None = 1, bookkeeping=None,
                 **flags) -> Report:
    """A full report for `trace` on the deployment of run `flags` (as `kvsim.make_config`): systems
    side by side, latency against rate (default: `kvsim.planning.reports.rates.rate_grid`, spanning the
    trace's rate and the engine's saturation) and block size (`block_sizes`; default: the sizes the
    engine profile's attention kernel runs, as `tune_block_size` picks them; empty: no such section).

    >>> import kvsim
    >>> tr = kvsim.generate_trace("alpaca", rate_rps=10, num_requests=30, seed=0)
    >>> rep = kvsim.trace_report(tr, rates=[5, 20], block_sizes=(8, 64), kv_gib=1)
    >>> [b[1] for b in rep.blocks if b[0] == "h"]
    ['Workload and deployment', "Systems at the trace's arrival times", 'Latency against request rate', 'Block size']
    """
    cfg = make_config(**flags)
    dep = cfg.deployment
    report = Report(title or f"Capacity plan: {trace.source or 'trace'} on {dep.model.name}, "
                             f"{dep.tp} x {dep.gpu.name}")
    report.heading("Workload and deployment")
    report.table("workload", workload_table(trace))
    report.paragraph(f"Model {dep.model.name} on {dep.tp} x {dep.gpu.name}; run flags: "
                     + (", ".join(f"`{k}={v}`" for k, v in sorted(flags.items()) if v is not None) or "defaults")
                     + ".")
    systems_section(report, trace, flags)
    base_rate = trace.summary()["rate_rps"]
    if rates is None and base_rate:
        from kvsim.planning.reports.rates import rate_grid
        rates = rate_grid(trace, cfg, base_rate)
    if rates:
        rate_section(report, trace, flags, rates, workers=workers)
    if block_sizes is None or len(block_sizes):
        block_size_section(report, trace, flags, block_sizes, workers, bookkeeping)
    return report


def sweep_report(table: pd.DataFrame, title: str = "Sweep report") -> Report:
    """A report of a sweep table (one row per run, `run_sweep` columns): the varying flags, latency
    against rate and waste/throughput against block size when those vary, memory breakdown and
    preemptions per run.

    >>> import kvsim
    >>> df = kvsim.run_sweep({"block_size": [8, 64]}, {"kv_gib": 1, "num_requests": 20}, preset="alpaca",
    ...                      workers=1)
    >>> [b[1] for b in kvsim.sweep_report(df).blocks if b[0] == "f"]
    ['block_size', 'memory_breakdown']
    """
    if "status" in table:
        failed = table[table.status != "ok"]
        table = table[table.status == "ok"]
    else:
        failed = table.iloc[0:0]
    if table.empty:
        raise ValueError("the sweep table has no successful runs to report")
    keys = [c for c in ("model", "gpu", "tp", "preset", "trace", "rate", "allocator", "reserve", "batching",
                        "block_size", "preemption", "max_num_seqs", "kv_gib", "prefix_caching",
                        "engine_profile") if c in table and table[c].astype(str).nunique() > 1]
    report = Report(title)
    report.heading("Runs")
    report.paragraph(f"{len(table)} runs" + (f" ({len(failed)} failed, listed at the end)" if len(failed) else "")
                     + (f"; varying: {', '.join(f'`{k}`' for k in keys)}." if keys else "."))
    label = (table[keys].apply(lambda r: "\n".join(value_label(k, r[k]) for k in keys), axis=1) if keys
             else pd.Series(["run"] * len(table), index=table.index))
    metrics = [c for c in SYSTEM_COLUMNS if c in table]
    report.table("runs", table[keys + metrics].rename(columns=SYSTEM_COLUMNS),
                 percent=[v for k, v in SYSTEM_COLUMNS.items() if "fraction" in k])
    other = [k for k in keys if k != "rate"]
    if "rate" in keys:
        report.figure("latency_vs_rate", figures.metric_lines(table, "rate", "normalized_latency_s_per_token",
                                                              hue=other))
    if "block_size" in keys:
        alloc = table.kv_mean_fraction_token_states + table.kv_mean_fraction_reserved \
            + table.kv_mean_fraction_internal_fragmentation
        waste = (table.kv_mean_fraction_reserved + table.kv_mean_fraction_internal_fragmentation) / alloc
        rest = [k for k in keys if k != "block_size"]
        d = table.assign(waste_fraction=waste)
        first = d if not rest else d[(d[rest].astype(str) == d[rest].astype(str).iloc[0]).all(axis=1)]
        report.figure("block_size", figures.block_size_curve(
            first, title="Waste and throughput against block size"
            + (f" ({', '.join(value_label(k, first[k].iloc[0]) for k in rest)})" if rest else "")))
    if len(table) <= 24:
        fr = {lab: {c: row[f"kv_mean_fraction_{c}"] for c in figures.CATEGORIES}
              for lab, (_, row) in zip(label, table.iterrows())}
        report.figure("memory_breakdown", figures.memory_breakdown(fr))
        preemptions_figure(report, dict(zip(label, table.preemptions)))
    if len(failed):
        report.heading("Failed runs")
        report.table("failed", failed[[c for c in ("run_id", *keys, "error") if c in failed]])
    return report


def read_sweep_table(path: str | Path) -> pd.DataFrame:
    """A sweep folder (results.parquet or results.csv) or a table file; ValueError naming the path."""
    p = Path(path)
    candidates = [p / "results.parquet", p / "results.csv"] if p.is_dir() else [p]
    for c in candidates:
        if c.exists():
            try:
                return pd.read_parquet(c) if c.suffix == ".parquet" else pd.read_csv(c)
            except Exception as exc:  # noqa: BLE001 - any reader error is a bad input file
                raise ValueError(f"{c}: cannot read the sweep table ({exc})") from None
    raise ValueError(f"{p}: no sweep table (results.parquet or results.csv) found")
