"""The GPUs that serve a request rate under an SLO, one replica's highest rate (`kvsim.planning.rate.search.max_rate`)
at each tensor-parallel degree divided into it (fleets simulated whole: `kvsim.planning.rate.fleet_gpus`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from kvsim.engine.config import SimConfig
from kvsim.planning.rate.gpu_search import gpu_search_config, tp_config
from kvsim.planning.rate.search import slo_text, max_rate, parse_slo
from kvsim.trace.table import Trace

if TYPE_CHECKING:
    import pandas as pd


def gpus_for_rate(rate_rps: float, slo: Sequence[str] | Mapping[str, float], config: SimConfig | None = None,
                  *, tp_options: Sequence[int] = (1, 2, 4, 8), trace: Trace | str | None = None,
                  preset: str | None = "sharegpt", duration_s: float = 600.0, seed: int = 0,
                  rel_tol: float = 0.05, max_runs: int = 12, workers: int = 1, max_span_s: float = 3600.0,
                  known: Mapping[int, Any] | None = None, progress: Callable[[str], None] | None = None,
                  **flags: Any) -> pd.DataFrame:
    """For each tensor-parallel degree: whether the weights fit, the highest rate one replica serves
    under `slo` (capped at `rate_rps`), the replicas needed for `rate_rps` (Poisson traffic split evenly)
    and the GPUs in all; `best` marks the fewest GPUs (ties: the smaller TP). KV memory comes from
    `gpu_mem_util` on each GPU (a fixed `kv_gib`/`num_blocks` would not scale with TP). Every TP whose
    single replica fits within the fewest GPUs found so far is searched. `known`: {tp: RateResult} of
    searches already made (the single-replica table's), reused so one TP has one rate;
    `progress(message)` hears what is tried and how many TP degrees are left.

    >>> import kvsim
    >>> kvsim.gpus_for_rate(4.0, {"ttft_p99": 2}, model="opt-13b", preset="alpaca",
    ...                     duration_s=60)  # doctest: +SKIP
    """
    import pandas as pd

    cfg = gpu_search_config(rate_rps, config, flags)
    slo = parse_slo(slo)
    rows, best = [], None
    tps = sorted(set(tp_options))
    for k, tp in enumerate(tps):
        row: dict[str, Any] = {"tp": tp, "fits": False, "max_rate_rps": None, "replicas": None, "gpus": None,
                               "limited_by": "", "note": ""}
        rows.append(row)
        c = tp_config(cfg, tp, best, row)
        if c is None:
            _say(progress, f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): {row['note']}")
            continue
        _say(progress, f"gpus-for: TP {tp} ({k + 1} of {len(tps)}): the highest rate one replica serves under "
                       f"the SLO{' (from the rate search above)' if known and tp in known else ''}")
        try:
            res = (known or {}).get(tp) or max_rate(
                slo, c, trace=trace, preset=preset, duration_s=duration_s, seed=seed, lo_rps=rate_rps,
                hi_rps=rate_rps, rel_tol=rel_tol, max_runs=max_runs, workers=workers, max_span_s=max_span_s,
                progress=progress)
        except ValueError as exc:
            row["note"] = str(exc)
            _say(progress, f"gpus-for: TP {tp} dropped: {exc}")
            continue
        per = min(res.rate_rps, rate_rps)
        replicas = math.ceil(rate_rps / per - 1e-9)
        row.update(max_rate_rps=per, replicas=replicas, gpus=tp * replicas,
                   limited_by=res.limit_key if replicas > 1 else "", note=res.note)
        _say(progress, f"gpus-for: TP {tp}: {per:.3g} req/s per replica -> {replicas} replica(s) = "
                       f"{tp * replicas} GPUs")
        best = min(best or math.inf, tp * replicas)
    df = pd.DataFrame(rows)
    if best is None:
        raise ValueError(f"no tensor-parallel degree in {list(tp_options)} serves any rate under the SLO "
                         f"{slo_text(slo)}: " + "; ".join(f"tp {r['tp']}: {r['note']}" for r in rows))
    df["best"] = df.gpus == best
    df.loc[df.best, "best"] = df[df.best].index == df[df.best].index.min()
    return df


def _say(progress: Callable[[str], None] | None, message: str) -> None:
    if progress is not None:
        progress(message)
