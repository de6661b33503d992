"""Planning with disaggregation: a disaggregated configuration from flat flags (the CLI's and a sweep
point's), one sweep row of a disaggregated run, and the P:D split search of
`kvsim capacity --gpus-for R --disagg`: for each TP degree and each GPU count (fewest first), every
split P + D of the instances simulated at rate R against the SLO attainment target, beside colocated
replicas of today's engine on the same GPUs. The smallest GPU count at which a split (or colocation)
meets the target answers; among its passing splits the best has the highest attainment.

Rates in req/s, SLOs in seconds.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from kvsim.engine.config import SimConfig
from kvsim.fleet.disagg.sim import DisaggConfig
from kvsim.fleet.disagg.slo import (attainment, colocated_columns, disagg_summary, goodput, met_slos,
                                    run_disagg)
from kvsim.fleet.disagg.kv_link import get_link
from kvsim.trace.table import Trace, rescale_trace

#: Sweep grid keys of a disaggregated run (a point with `prefill_replicas` or `decode_replicas` runs one).
DISAGG_KEYS = ("prefill_replicas", "decode_replicas", "prefill_tp", "decode_tp", "kv_link", "ttft_slo",
               "tpot_slo")


def disagg_config(cfg: SimConfig, prefill_replicas: int | None, decode_replicas: int | None,
                  prefill_tp: int | None = None, decode_tp: int | None = None,
                  kv_link: str = "nvlink") -> DisaggConfig:
    """P prefill and D decode instances of `cfg` (each side's TP, default `cfg`'s) over `kv_link`;
    ValueError naming the flag when one is wrong or missing."""
    if prefill_replicas is None:
        raise ValueError("--decode-replicas needs --prefill-replicas (a P:D split needs a prefill side)")
    if decode_replicas is None:
        raise ValueError("--prefill-replicas needs --decode-replicas >= 1 (a P:D split needs a decode side)")
    link = get_link(str(kv_link))
    sides = []
    for flag, tp in (("--prefill-tp", prefill_tp), ("--decode-tp", decode_tp)):
        try:
            sides.append(cfg if tp is None else replace(cfg, deployment=replace(cfg.deployment, tp=int(tp))))
        except ValueError as exc:
            raise ValueError(f"{flag}: {exc}") from None
    return DisaggConfig(sides[0], sides[1], int(prefill_replicas), int(decode_replicas), link)


def disagg_row(trace: Trace, cfg: SimConfig, flags: Mapping[str, Any]) -> dict[str, Any]:
    """One sweep row: a disaggregated run of `trace` under `flags` (`DISAGG_KEYS`), flat metrics."""
    dcfg = disagg_config(cfg, flags.get("prefill_replicas"), flags.get("decode_replicas"),
                         flags.get("prefill_tp"), flags.get("decode_tp"), flags.get("kv_link", "nvlink"))
    ttft_slo, tpot_slo = float(flags.get("ttft_slo", 0.2)), float(flags.get("tpot_slo", 0.1))
    s = disagg_summary(run_disagg(trace, dcfg), ttft_slo, tpot_slo)
    d = s["disaggregation"]
    row = {"requests": s["requests"], "requests_finished": s["finished"], "requests_rejected": s["rejected"],
           "gpus": d["gpus"], "slo_attainment": s["slo"]["attainment"], "kv_transfers": d["transfers"],
           "kv_transfer_bytes": d["transfer_bytes"], "kv_transfer_mean_s": d["transfer_s"]["mean"],
           "held_at_prefill_p99_s": d["held_at_prefill_s"]["p99"]}
    for metric in ("ttft_s", "tpot_s"):
        for q, v in s[metric].items():
            row[f"{metric[:4]}_{q}"] = v
    return row


def split_search(trace: Trace, cfg: SimConfig, rate_rps: float, *, tp_options: Sequence[int] = (1, 2, 4, 8),
                 max_gpus: int = 16, kv_link: str = "nvlink", ttft_slo: float = 0.2, tpot_slo: float = 0.1,
                 target: float = 0.9, cost=None, progress=None, steady=None,
                 longer=None) -> list[dict[str, Any]]:
    """Rows (tp, gpus, prefill, decode (0 and 0 for colocated), attainment, meets, best, span_s, note)
    for the fewest GPUs per TP degree at which a split or colocation meets `target` at `rate_rps`
    (`trace` rescaled to it; TP degrees that meet it nowhere up to `max_gpus` have no rows); the answer
    is the row marked `best`: fewest GPUs, then decided before uncertain, then highest attainment, then
    colocated before a split. `cost`: a cost model for every run (tests). `progress(message)` hears each
    candidate (TP, GPUs, P:D) as it is simulated, with the runs left at most, each rerun and each TP
    degree dropped and why.

    `steady(run_at, met, target)`: each layout's steady-state verdict, as fleets and the rate search
    are judged (`functools.partial(kvsim.planning.rate.fleet_steady.judge_attainment, duration_s=...,
    rate_rps=..., max_excess=..., max_span_s=...)`; `duration_s` None: the trace as given, never
    extended): the trend of requests in the system and the batch means of the misses over the second
    half (`steady_verdict`, `attainment_low` (one-sided 95 % lower bound), `window_requests` set in the
    row); a layout they cannot decide runs again on `longer(span_s)` (the workload at `rate_rps` over
    `span_s` s), its span doubled up to the cap; at the cap a pass still growing fails and one still
    undecided stands with its `note` (uncertain). None: the attainment over the trace as given decides.
    `span_s` is the span each row was judged on."""
    from kvsim.fleet.config import check_units
    check_units(max_gpus, "--max-gpus")
    if not rate_rps > 0:
        raise ValueError(f"--gpus-for must be > 0 requests/s, got {rate_rps}")
    if not 0 < target <= 1:
        raise ValueError(f"--slo-attainment must be in (0, 1], got {target}")
    tr = rescale_trace(trace, rate_rps=rate_rps)
    link, rows = get_link(kv_link), []
    say = progress or (lambda message: None)
    tps = sorted(set(tp_options))
    left = sum(n for tp in tps for n in range(2, max_gpus // tp + 1))      # layouts at most, all TPs
    done = 0
    for tp in tps:
        try:
            side = replace(cfg, deployment=replace(cfg.deployment, tp=tp))
            DisaggConfig(side, side, 1, 1, link)
        except ValueError as exc:
            left -= sum(range(2, max_gpus // tp + 1))
            say(f"disagg: TP {tp} dropped: {exc}")
            continue
        met = False
        for n in range(2, max_gpus // tp + 1):
            found = []
            for p in range(1, n + 1):
                name = f"TP {tp}, {n * tp} GPUs, " + (f"{p}P:{n - p}D" if p < n else "colocated")
                say(f"disagg: {name} (layout {done + 1} of at most {left})")

                def run(t: Trace, p=p, n=n) -> dict:
                    return (run_disagg(t, DisaggConfig(side, side, p, n - p, link), cost).request_columns()
                            if p < n else colocated_columns(t, side, n, cost))
                row = {"tp": tp, "gpus": n * tp, "prefill": p % n, "decode": (n - p) % n, "note": ""}
                row.update(_judged(run, tr, steady, longer, ttft_slo, tpot_slo, target,
                                   lambda msg, name=name: say(f"disagg: {name}: {msg}")))
                found.append(row)
                done += 1
            top = max(found, key=lambda r: (r["meets"], r["attainment"]))
            if top["meets"]:
                rows += found
                left = done + sum(m for t in tps if t > tp for m in range(2, max_gpus // t + 1))
                met = True
                break
            growing = [r for r in found if r["attainment"] >= target]
            say(f"disagg: TP {tp}, {n * tp} GPUs dropped: " + (
                f"the {len(growing)} layout(s) meeting {target:.0%} on the trace are not stable: {growing[0]['note']}"
                if growing else f"the best of {len(found)} layouts attains {top['attainment']:.1%} < {target:.0%}"))
        if not met:
            say(f"disagg: TP {tp} dropped: no layout of up to {max_gpus} GPUs attains {target:.0%}")
    passing = [r for r in rows if r["meets"]]
    if not passing:
        raise ValueError(f"no split of up to {max_gpus} GPUs (TP {', '.join(map(str, tp_options))}) serves "
                         f"{rate_rps} req/s with {target:.0%} of requests within TTFT {ttft_slo} s and TPOT "
                         f"{tpot_slo} s")
    best = min(passing, key=lambda r: (r["gpus"], bool(r["note"]), -r["attainment"], r["prefill"] != 0))
    for r in rows:
        r["best"] = r is best
    return rows


def _judged(run, tr: Trace, steady, longer, ttft_slo: float, tpot_slo: float, target: float,
            say) -> dict[str, Any]:
    """One layout's figures: `run(trace)` -> its per-request columns; judged at steady state by
    `steady` when given (`split_search`), else by the attainment over `tr` as given."""
    if steady is None:
        att = attainment(run(tr), ttft_slo, tpot_slo)
        return {"attainment": att, "meets": att >= target, "span_s": float(tr.arrival_s[-1])}
    runs = []

    def run_at(span):                      # the first run is on `tr`, each later one on a longer trace
        t = longer(span) if runs else tr
        if runs:
            say(f"its verdict is not decided yet: running it again on {span:.0f} s of arrivals")
        runs.append(span)
        return run(t), float(span if span is not None else t.arrival_s[-1])

    v = steady(run_at, lambda cols: met_slos(cols, ttft_slo, tpot_slo), target)
    s = v.summary
    low = "" if s["attainment_low"] is None else f", at least {s['attainment_low']:.1%} at steady state"
    say(f"attainment {s['attainment']:.1%} over {v.span_s:.0f} s{low}: {'meets' if v.ok else 'misses'} "
        f"{target:.0%}" + (f" ({v.note})" if v.note and (v.ok or v.note.startswith("still")) else ""))
    return {"attainment": s["attainment"], "meets": v.ok, "span_s": v.span_s, "note": v.note, "runs": v.runs,
            "steady_verdict": s["steady_verdict"], "attainment_low": s["attainment_low"],
            "window_requests": s["window_requests"], "window_requests_needed": s["window_requests_needed"],
            "trend_excess": s["trend_excess"]}


def simulate_disagg(trace: Trace, config: SimConfig, prefill_replicas: int, decode_replicas: int, *,
                    prefill_tp: int | None = None, decode_tp: int | None = None, kv_link: str = "nvlink",
                    cost=None):
    """Run `trace` on P prefill and D decode instances of `config` (`kvsim.fleet.disagg.sim.DisaggSim`, run);
    its `request_columns()` have TTFT and TPOT per request, `disagg_summary` the figures.

    >>> import kvsim
    >>> t = kvsim.Trace.from_arrays([0.0, 0.1], [500, 800], [20, 30])
    >>> sim = kvsim.simulate_disagg(t, kvsim.make_config(gpu="a100-80gb"), 1, 1)
    >>> sim.request_columns()["status"].tolist()
    ['finished', 'finished']
    """
    cfg = disagg_config(config, prefill_replicas, decode_replicas, prefill_tp, decode_tp, kv_link)
    return run_disagg(trace, cfg, cost)


def disagg_goodput(trace: Trace, config: SimConfig, prefill_replicas: int = 0, decode_replicas: int = 0, *,
                   replicas: int = 0, prefill_tp: int | None = None, decode_tp: int | None = None,
                   kv_link: str = "nvlink", ttft_slo: float = 0.2, tpot_slo: float = 0.1,
                   target: float = 0.9, rel_tol: float = 0.05) -> tuple[float, dict[float, float]]:
    """Goodput (req/s; `kvsim.fleet.disagg.slo.goodput`) of P:D disaggregated instances, or with
    `replicas` of that many colocated replicas fed round-robin, on `trace` rescaled to each rate tried;
    and the attainment at every rate tried."""
    if replicas:
        def attained(rate: float) -> float:
            return attainment(colocated_columns(rescale_trace(trace, rate_rps=rate), config, replicas),
                              ttft_slo, tpot_slo)
    else:
        cfg = disagg_config(config, prefill_replicas, decode_replicas, prefill_tp, decode_tp, kv_link)

        def attained(rate: float) -> float:
            sim = run_disagg(rescale_trace(trace, rate_rps=rate), cfg)
            return attainment(sim.request_columns(), ttft_slo, tpot_slo)
    return goodput(attained, target, rel_tol=rel_tol)
