"""GPUs for a request rate by simulating whole fleets (`gpus_for_fleet`): for each tensor-parallel
degree, the fewest replicas whose fleet, behind the chosen router, serves the workload at that rate
within the SLO; not one replica's best rate divided into the target (`kvsim.planning.rate.gpus.gpus_for_rate`,
which assumes perfect balance and the same prefix-cache hits on every replica).

Each replica count tried is one fleet simulation (kvsim/fleet/sim.py) of the same trace: the counts
double from one until a fleet meets the SLO, then bisect between the last that failed and the first that
met it (more replicas are taken never to serve worse). A TP degree is not searched past the GPUs a smaller
degree already needs. Each fleet is judged at steady state (`kvsim.planning.rate.fleet_steady`: the single-
replica search's trend and batch-means tests, rerun on a longer trace up to `max_span_s` while undecided).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from kvsim.fleet.config import FleetConfig
from kvsim.fleet.sim import simulate_fleet
from kvsim.planning.rate.fleet_steady import FleetVerdict, judge
from kvsim.planning.rate.gpu_search import gpu_search_config, tp_config
from kvsim.planning.rate.search import meets, parse_slo, slo_value
from kvsim.planning.runs import summary_row
from kvsim.planning.sweep.runner import workload
from kvsim.trace.table import Trace

#: Most replicas a search tries per TP degree.
MAX_REPLICAS = 512


def gpus_for_fleet(rate_rps: float, slo: Sequence[str] | Mapping[str, float], config=None, *,
                   router: str = "round-robin", tp_options: Sequence[int] = (1, 2, 4, 8),
                   trace: Trace | str | None = None, preset: str | None = "sharegpt", duration_s: float = 600.0,
                   seed: int = 0, max_replicas: int = MAX_REPLICAS, fleet_flags: Mapping[str, Any] | None = None,
                   progress=None, max_span_s: float = 3600.0, max_excess: float = 0.025,
                   **flags: Any) -> pd.DataFrame:
    """One row per TP degree: whether the weights fit, the fewest `replicas` meeting `slo` at `rate_rps`
    (the trace rescaled to it, or a Poisson `preset` trace of `duration_s` s), `gpus`, the SLO metrics
    and prefix hit rate of that fleet, the fleet simulations run (`runs`), the trace span it was judged on
    (`span_s`, s: each fleet is judged at steady state, its trace doubled up to `max_span_s` while
    undecided; `max_excess`: the fraction of arrivals that may accumulate, half the rate search's default
    tolerance, `kvsim.planning.rate.steady`); `best` marks the fewest GPUs (ties: the smaller TP).
    `fleet_flags`: the router's thresholds (`FleetConfig` fields).
    `progress(message)` hears each fleet simulated and each TP degree dropped, with how many are left.

    >>> import kvsim
    >>> kvsim.gpus_for_fleet(8.0, {"ttft_p99": 2}, router="prefix-aware", preset="sharegpt",
    ...                      duration_s=60, model="llama-3-8b", gpu="h100-80gb")  # doctest: +SKIP
    """
    cfg = gpu_search_config(rate_rps, config, flags)
    slo = parse_slo(slo)
    FleetConfig(1, router, **(fleet_flags or {}))                 # a bad router fails before any run
    if isinstance(trace, str):
        from kvsim.trace.formats import load_trace
        trace = load_trace(trace)
    point = ({"rate": rate_rps, "seed": seed} if trace is not None else
             {"preset": preset or "sharegpt", "rate": rate_rps, "duration_s": duration_s, "seed": seed})
    traces: dict[float | None, Trace] = {None: workload(point, trace)}

    def trace_at(span: float | None) -> Trace:
        if span not in traces:
            traces[span] = workload({**point, "duration_s": span})
        return traces[span]

    span0 = None if trace is not None else float(duration_s)
    judging = dict(slo=slo, duration_s=span0, rate_rps=rate_rps, max_excess=max_excess, max_span_s=max_span_s)
    rows, best = [], None
    say = progress or (lambda message: None)
    tps = sorted(set(tp_options))
    for k, tp in enumerate(tps):
        row: dict[str, Any] = {"tp": tp, "router": router, "fits": False, "replicas": None, "gpus": None,
                               "runs": 0, "span_s": None, "note": ""}
        rows.append(row)
        c = tp_config(cfg, tp, best, row)
        if c is None:
            say(f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): {row['note']}")
            continue
        limit = min(max_replicas, best // tp if best is not None else max_replicas)
        found = _fewest_replicas(trace_at, judging, c, router, fleet_flags or {}, limit, row,
                                 lambda n, v: say(f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): {n} replica(s) "
                                                  f"behind {router} {'meet' if v.ok else 'miss'} the SLO at steady "
                                                  f"state (judged on {v.span_s:.0f} s, {v.runs} run(s); up to "
                                                  f"{limit} tried){': ' + v.note if v.note else ''}"))
        if found is None:
            row["note"] = row["note"] or f"no fleet of up to {limit} replicas meets the SLO"
            say(f"gpus-for: TP {tp} dropped: {row['note']}")
            continue
        replicas, v = found
        flat = summary_row(v.summary)
        row.update(replicas=replicas, gpus=tp * replicas, span_s=v.span_s, note=v.note,
                   prefix_cache_hit_rate=flat.get("prefix_cache_hit_rate"),
                   imbalance_requests=flat.get("fleet_imbalance_requests_max_over_mean"),
                   **{metric: slo_value(flat, metric) for metric in slo})
        best = min(best or tp * replicas, tp * replicas)
    df = pd.DataFrame(rows)
    if best is None:
        raise ValueError(f"no tensor-parallel degree in {list(tp_options)} serves {rate_rps:g} req/s under the "
                         "SLO: " + "; ".join(f"tp {r['tp']}: {r['note']}" for r in rows))
    df["best"] = df.gpus == best
    df.loc[df.best, "best"] = df[df.best].index == df[df.best].index.min()
    return df


def _fewest_replicas(trace_at, judging: dict, cfg, router: str, fleet_flags: Mapping[str, Any], limit: int,
                     row: dict, heard=None) -> tuple[int, FleetVerdict] | None:
    """(fewest replicas <= `limit` whose fleet meets the SLO at steady state, its verdict), or None;
    counts fleet simulations in `row`. `trace_at(span)`: the workload of `span` s (None: as given);
    `judging`: `fleet_steady.judge`'s keywords."""
    tried: dict[int, FleetVerdict] = {}
    slo = judging["slo"]

    def ok(n: int) -> bool:
        if n not in tried:
            def run_at(span):
                tr = trace_at(span)
                summary, columns = _simulate(tr, cfg, FleetConfig(n, router, **fleet_flags))
                return summary, columns, float(span if span is not None else tr.arrival_s[-1])

            tried[n] = judge(run_at, passes=lambda s: meets({**summary_row(s), "status": "ok"}, slo), **judging)
            row["runs"] += tried[n].runs
            if heard is not None:
                heard(n, tried[n])
        return tried[n].ok

    lo, hi = 0, 1                    # lo fails (0 replicas serve nothing), hi is the next to try
    while hi <= limit and not ok(hi):
        lo, hi = hi, hi * 2
    if hi > limit:
        if lo < limit and ok(limit):
            hi = limit
        else:
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid, hi)
    return hi, tried[hi]


def _simulate(trace: Trace, cfg, fleet: FleetConfig) -> tuple[dict, dict]:
    """One fleet run: (its summary as `kvsim.fleet.sim.run_summary` gives it, its per-request columns)."""
    result = simulate_fleet(trace, cfg, fleet)
    section = {k: v for k, v in result.summary["fleet"].items() if k != "per_replica"}
    section["routed"] = " ".join(map(str, section["routed"]))
    return {**result.summary, "fleet": section}, result.request_columns
