"""One sweep point: the trace it replays (`workload`) and its row (`run_point`: the point, the resolved
configuration and every summary metric, or the error), as `kvsim.planning.sweep.runner` runs it in its worker
processes; `run_point_parts` also hands back the column sets a shared run is kept as
(`kvsim.planning.run_cache`)."""

from __future__ import annotations

import time
from functools import lru_cache
from typing import Any, Mapping

from kvsim.engine.config import SimConfig
from kvsim.fleet.config import FLEET_FLAGS, fleet_from_flags
from kvsim.planning.runs import config_row, make_config, summary_row
from kvsim.planning.sweep.grid import DISAGG_KEYS, WORKLOAD_KEYS, run_id
from kvsim.trace.table import Trace


@lru_cache(maxsize=8)
def _preset_trace(preset: str, rate: float, duration_s: float | None, num_requests: int | None,
                  seed: int) -> Trace:
    from kvsim.trace.synthetic import generate
    return generate(preset, rate_rps=rate, duration_s=duration_s, num_requests=num_requests, seed=seed)


@lru_cache(maxsize=8)
def _file_trace(path: str) -> Trace:
    from kvsim.trace.formats import load_trace
    return load_trace(path)


def workload(point: Mapping[str, Any], trace: Trace | None = None) -> Trace:
    """The trace a point runs: `trace` (or the point's `trace` path) rescaled by `rate`/`time_scale`
    and cut at `duration_s` s, or a Poisson trace of `preset` at `rate` req/s (default 2) for
    `duration_s` s (default 3600)."""
    from kvsim.trace.table import rescale_trace

    seed = int(point.get("seed", 0))
    if point.get("preset") is not None:
        if trace is not None or point.get("trace") is not None:
            raise ValueError("give a trace or a preset, not both")
        num = point.get("num_requests")
        duration = None if num is not None else float(point.get("duration_s", 3600.0))
        tr = _preset_trace(str(point["preset"]), float(point.get("rate", 2.0)), duration,
                           None if num is None else int(num), seed)
        if point.get("time_scale") is not None:
            tr = rescale_trace(tr, time_scale=float(point["time_scale"]))
    else:
        if trace is None:
            if point.get("trace") is None:
                raise ValueError("no workload: give a trace or a preset")
            trace = _file_trace(str(point["trace"]))
        tr = trace
        if point.get("max_requests") is not None:
            tr = tr.head(int(point["max_requests"]))
        if point.get("rate") is not None:
            tr = rescale_trace(tr, rate_rps=float(point["rate"]))
        if point.get("time_scale") is not None:
            tr = rescale_trace(tr, time_scale=float(point["time_scale"]))
        if point.get("duration_s") is not None:
            tr = tr.until(float(point["duration_s"]))
    return tr


def run_point(point: Mapping[str, Any], trace: Trace | None = None,
              config: SimConfig | None = None) -> dict[str, Any]:
    """One grid point -> one row; any error is caught and recorded in the row (`status="error"`).
    The point's run flags apply over `config` when given."""
    return run_point_parts(point, trace, config)[0]


def run_point_parts(point: Mapping[str, Any], trace: Trace | None = None,
                    config: SimConfig | None = None) -> tuple[dict[str, Any], tuple[dict, dict] | None]:
    """`run_point`'s row and the two column sets it merged (the configuration's, the result's; None
    when the run failed), for `kvsim.planning.run_cache`."""
    from kvsim.fleet.sim import run_summary

    start = time.perf_counter()
    parts = None
    try:
        flags = {k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in DISAGG_KEYS
                 and k not in FLEET_FLAGS}
        cfg = make_config(config, **flags)
        tr = workload(point, trace)
        if point.get("prefill_replicas") is not None or point.get("decode_replicas") is not None:
            from kvsim.fleet.disagg.plan import disagg_row
            parts = (config_row(cfg), disagg_row(tr, cfg, point))
        elif point.get("stop_above_s_per_token") is not None and fleet_from_flags(point) is None:
            from kvsim.planning.sweep.latency_ceiling import run_capped
            parts = (config_row(cfg), summary_row(run_capped(tr, cfg, point["stop_above_s_per_token"])[0]))
        else:
            summary = run_summary(tr, cfg, fleet_from_flags(point))    # a row needs the summary only
            parts = (config_row(cfg), summary_row(summary))
        row = point_row(point, parts)
    except Exception as exc:  # noqa: BLE001 - a failing point is a recorded row, never a stopped grid
        row = {"run_id": run_id(point), **point, "status": "error", "error": f"{type(exc).__name__}: {exc}"}
        parts = None
    row["wall_s"] = time.perf_counter() - start
    if parts is not None:
        parts[1]["wall_s"] = row["wall_s"]       # (kept with the result: a shared run's own time)
    return row, parts


def point_row(point: Mapping[str, Any], parts: tuple[dict, dict]) -> dict[str, Any]:
    """The row of `point` from its run's column sets: the point, its configuration, the point again
    (its spelling of the flags), then the result; `wall_s` last when the result carries it."""
    config, result = parts
    row = {"run_id": run_id(point), **point, **config, **point,
           **{k: v for k, v in result.items() if k != "wall_s"}, "status": "ok", "error": ""}
    if "wall_s" in result:
        row["wall_s"] = result["wall_s"]
    return row


def shared_row(point: Mapping[str, Any], made: tuple[dict[str, Any], tuple[dict, dict] | None]) -> dict[str, Any]:
    """The row of `point` whose run is another point's (`made`: that run's row and column sets): its
    own row from the column sets, or, when the run failed, that failure under its own id."""
    row, parts = made
    if parts is not None:
        return point_row(point, parts)
    return {"run_id": run_id(point), **point, "status": "error", "error": row["error"], "wall_s": row["wall_s"]}
