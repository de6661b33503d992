"""GPUs for a request rate by simulating whole fleets (`gpus_for_fleet`): for each tensor-parallel
degree, the fewest replicas whose fleet, behind the chosen router, serves the workload at that rate
within the SLO; not one replica's best rate divided into the target (`kvsim.planning.rate.gpus.gpus_for_rate`,
which assumes perfect balance and the same prefix-cache hits on every replica).

Each replica count tried is one fleet simulation (kvsim/fleet/sim.py) of the same trace: the counts
double from one until a fleet meets the SLO, then bisect between the last that failed and the first that
met it (more replicas are taken never to serve worse). A TP degree is not searched past the GPUs a smaller
degree already needs.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd

from kvsim.fleet.config import FleetConfig
from kvsim.fleet.sim import run_summary
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
                   progress=None, **flags: Any) -> pd.DataFrame:
    """One row per TP degree: whether the weights fit, the fewest `replicas` meeting `slo` at `rate_rps`
    (the trace rescaled to it, or a Poisson `preset` trace of `duration_s` s), `gpus`, the SLO metrics
    and prefix hit rate of that fleet, the fleet simulations run (`runs`); `best` marks the fewest GPUs
    (ties: the smaller TP). `fleet_flags`: the router's thresholds (`FleetConfig` fields).
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
    tr = workload(point, trace)
    rows, best = [], None
    say = progress or (lambda message: None)
    tps = sorted(set(tp_options))
    for k, tp in enumerate(tps):
        row: dict[str, Any] = {"tp": tp, "router": router, "fits": False, "replicas": None, "gpus": None,
                               "runs": 0, "note": ""}
        rows.append(row)
        c = tp_config(cfg, tp, best, row)
        if c is None:
            say(f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): {row['note']}")
            continue
        limit = min(max_replicas, best // tp if best is not None else max_replicas)
        found = _fewest_replicas(tr, c, router, fleet_flags or {}, slo, limit, row,
                                 lambda n, ok: say(f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): {n} replica(s) "
                                                   f"behind {router} {'meet' if ok else 'miss'} the SLO "
                                                   f"(up to {limit} tried)"))
        if found is None:
            row["note"] = row["note"] or f"no fleet of up to {limit} replicas meets the SLO"
            say(f"gpus-for: TP {tp} dropped: {row['note']}")
            continue
        replicas, summary = found
        flat = summary_row(summary)
        row.update(replicas=replicas, gpus=tp * replicas,
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


def _fewest_replicas(trace: Trace, cfg, router: str, fleet_flags: Mapping[str, Any], slo: dict, limit: int,
                     row: dict, heard=None) -> tuple[int, dict] | None:
    """(fewest replicas <= `limit` whose fleet meets `slo`, its summary), or None; counts runs in `row`."""
    tried: dict[int, dict] = {}

    def ok(n: int) -> bool:
        if n not in tried:
            summary = run_summary(trace, cfg, FleetConfig(n, router, **fleet_flags))
            summary["meets_slo"] = meets({**summary_row(summary), "status": "ok"}, slo)
            tried[n] = summary
            row["runs"] += 1
            if heard is not None:
                heard(n, summary["meets_slo"])
        return tried[n]["meets_slo"]

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
