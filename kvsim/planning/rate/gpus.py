"""The GPUs that serve a request rate under an SLO, one replica's highest rate (`kvsim.planning.rate.search.max_rate`)
at each tensor-parallel degree divided into it (fleets simulated whole: `kvsim.planning.rate.fleet_gpus`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

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
                  **flags: Any) -> pd.DataFrame:
    """For each tensor-parallel degree: whether the weights fit, the highest rate one replica serves
    under `slo` (capped at `rate_rps`), the replicas needed for `rate_rps` (Poisson traffic split evenly)
    and the GPUs in all; `best` marks the fewest GPUs (ties: the smaller TP). KV memory comes from
    `gpu_mem_util` on each GPU (a fixed `kv_gib`/`num_blocks` would not scale with TP).

    >>> import kvsim
    >>> kvsim.gpus_for_rate(4.0, {"ttft_p99": 2}, model="opt-13b", preset="alpaca",
    ...                     duration_s=60)  # doctest: +SKIP
    """
    import pandas as pd

    cfg = gpu_search_config(rate_rps, config, flags)
    slo = parse_slo(slo)
    rows, best = [], None
    for tp in sorted(set(tp_options)):
        row: dict[str, Any] = {"tp": tp, "fits": False, "max_rate_rps": None, "replicas": None, "gpus": None,
                               "limited_by": "", "note": ""}
        rows.append(row)
        c = tp_config(cfg, tp, best, row)
        if c is None:
            continue
        try:
            res = max_rate(slo, c, trace=trace, preset=preset, duration_s=duration_s, seed=seed,
                           lo_rps=rate_rps, hi_rps=rate_rps, rel_tol=rel_tol, max_runs=max_runs,
                           workers=workers, max_span_s=max_span_s)
        except ValueError as exc:
            row["note"] = str(exc)
            continue
        replicas = math.ceil(rate_rps / res.rate_rps - 1e-9)
        row.update(max_rate_rps=res.rate_rps, replicas=replicas, gpus=tp * replicas,
                   limited_by=res.limit_key if replicas > 1 else "")
        best = min(best or math.inf, tp * replicas)
    df = pd.DataFrame(rows)
    if best is None:
        raise ValueError(f"no tensor-parallel degree in {list(tp_options)} serves any rate under the SLO "
                         f"{slo_text(slo)}: " + "; ".join(f"tp {r['tp']}: {r['note']}" for r in rows))
    df["best"] = df.gpus == best
    df.loc[df.best, "best"] = df[df.best].index == df[df.best].index.min()
    return df
