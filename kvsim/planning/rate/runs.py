"""The rate search's runs: one simulation per rate, stopped as soon as it has missed the SLO for
certain (`kvsim.planning.rate.bounds.SloWatch`), each row the flat run row a sweep would write
(`kvsim.planning.sweep.runner.run_point`) plus `stopped_early_s` when it stopped. Rows of runs already made
in this process are reused (a cache keyed by the whole configuration, the workload and the SLO).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from kvsim.engine.config import SimConfig
from kvsim.trace.table import Trace

#: Rows of finished rate runs in this process: (config repr, point, slo, trace id) -> row.
_CACHE: dict[tuple, dict] = {}
_CACHE_MAX = 256


def run_rate(point: Mapping[str, Any], trace: Trace | None, config: SimConfig,
             slo: Mapping[str, float]) -> dict[str, Any]:
    """One rate's run (`point`: the workload keys of `kvsim.planning.sweep.point.workload`) -> its row; an
    error is recorded in the row (`status="error"`), as a sweep does."""
    from kvsim.engine.sim import simulate
    from kvsim.planning.rate.bounds import SloWatch
    from kvsim.planning.runs import config_row, summary_row
    from kvsim.planning.sweep.grid import run_id
    from kvsim.planning.sweep.point import workload

    start = time.perf_counter()
    row: dict[str, Any] = {"run_id": run_id(point), **point}
    try:
        tr = workload(point, trace)
        result = simulate(tr, config, keep_steps=False, stop_when=SloWatch(slo, tr.arrival_s, tr.output_tokens))
        row.update({**config_row(config), **point, **summary_row(result.summary)})
        row.update(status="ok", error="")
        row.update(_steady_row(result.request_columns, tr, point, slo, result.summary.get("stopped_early_s")))
    except Exception as exc:  # noqa: BLE001 - a failing rate is a recorded row, as in a sweep
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    row["wall_s"] = time.perf_counter() - start
    return row


def _steady_row(columns: Mapping[str, Any], trace: Trace, point: Mapping[str, Any], slo: Mapping[str, float],
                stopped_s: float | None) -> dict[str, Any]:
    """The run's steady-state figures over the second half of what it simulated (up to `stopped_s`, else
    the trace's span: the point's duration, else its last arrival): `span_s`, `trend_z`, `trend_excess`,
    `trend_in_system` (`kvsim.planning.rate.steady.trend`) and `steady_verdict`
    (`kvsim.planning.rate.windows.verdict`)."""
    import numpy as np

    from kvsim.planning.rate.steady import trend
    from kvsim.planning.rate.windows import verdict

    arrival = np.asarray(columns["arrival_s"], dtype=float)
    finished = np.asarray(columns["finished_s"], dtype=float)
    finished = np.where(np.asarray(columns["status"]) == "rejected", arrival, finished)
    span = float(point["duration_s"]) if point.get("duration_s") is not None else float(trace.arrival_s[-1])
    t_end = span if stopped_s is None else float(stopped_s)
    t = trend(arrival, np.where(finished > t_end, np.nan, finished), t_end)
    return {"span_s": span, "trend_z": t.z, "trend_excess": t.excess, "trend_in_system": t.mean_in_system,
            "steady_verdict": verdict(columns, slo, t_end)}


def _key(point: Mapping[str, Any], trace: Trace | None, config: SimConfig, slo: Mapping[str, float]) -> tuple:
    return (repr(config), tuple(sorted(point.items())), tuple(sorted(slo.items())), _fingerprint(trace))


def _fingerprint(trace: Trace | None) -> str:
    """A digest of the trace's requests: every column (prefix groups and block hashes included) but its
    label (`kvsim.planning.run_cache.trace_digest`)."""
    from kvsim.planning.run_cache import trace_digest
    return "" if trace is None else trace_digest(trace)


def evaluate(points: list[dict], trace: Trace | None, config: SimConfig, slo: Mapping[str, float],
             workers: int, on_row: Callable[[dict], None]) -> None:
    """Run `points` (on `workers` processes; 1: here), handing each row to `on_row` as it finishes."""
    todo = []
    for p in points:
        row = _CACHE.get(_key(p, trace, config, slo))
        if row is not None:
            on_row(dict(row))
        else:
            todo.append(p)

    def done(p: dict, row: dict) -> None:
        if row.get("status") == "ok":
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.pop(next(iter(_CACHE)))
            _CACHE[_key(p, trace, config, slo)] = dict(row)
        on_row(row)

    if workers <= 1 or len(todo) <= 1:
        for p in todo:
            done(p, run_rate(p, trace, config, slo))
        return
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(workers, len(todo))) as pool:
        futures = {pool.submit(run_rate, p, trace, config, slo): i for i, p in enumerate(todo)}
        for fut, i in futures.items():
            done(todo[i], fut.result())


#: Requests per block of a preset's common base trace (blocks are drawn with seeds derived from the run's).
BASE_BLOCK = 4096


def base_trace(preset: str, span_s: float, seed: int) -> Trace:
    """Requests of `preset` with Poisson arrivals at 1 req/s covering at least `span_s` s, built from
    blocks of BASE_BLOCK requests, each drawn with its own derived seed, so a longer base starts with the
    same requests as a shorter one. Every rate tried replays it rescaled (common random numbers): the
    curve moves with the rate, not with a new draw."""
    import numpy as np

    from kvsim.trace.synthetic import generate

    arrivals, prompts, outputs, t0, k = [], [], [], 0.0, 0
    while t0 <= span_s:
        block = generate(preset, rate_rps=1.0, num_requests=BASE_BLOCK, seed=seed * 1_000_003 + k)
        arrivals.append(block.arrival_s + t0)
        prompts.append(block.prompt_tokens)
        outputs.append(block.output_tokens)
        t0, k = float(arrivals[-1][-1]), k + 1
    return Trace.from_arrays(np.concatenate(arrivals), np.concatenate(prompts), np.concatenate(outputs),
                             source=f"{preset}-base-seed{seed}")
