"""A grid of runs over any run flag, on local processes (all cores by default) or Ray, into one tidy table.

Each grid point is a dict of run flags (`kvsim.planning.runs`) and workload keys (`WORKLOAD_KEYS`); a
point's row holds the point, the resolved configuration, every summary metric, `status` and `error`.
A failing point becomes a row with `status="error"` and the grid goes on. With `out_dir`, rows are
appended to `rows.jsonl` as they finish (so an interrupted sweep resumes from it) and the whole table
is written at the end as `results.parquet` and `results.csv`.

>>> import kvsim
>>> df = kvsim.run_sweep({"block_size": [8, 32], "allocator": ["paged"]}, {"kv_gib": 12},
...                      preset="alpaca", workers=1, duration_s=30)  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import sys
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from kvsim.engine.config import SimConfig
from kvsim.planning import sweep_store as store
from kvsim.planning.pool import run_pool
from kvsim.planning.runs import config_row, make_config, summary_row
from kvsim.planning.sweep_grid import DISAGG_KEYS, WORKLOAD_KEYS, check_workload, grid_points, run_id
from kvsim.planning.sweep_store import CSV_FILE, PARQUET_FILE, ROWS_FILE
from kvsim.fleet.config import FLEET_FLAGS, fleet_from_flags
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
    from kvsim.fleet.sim import run_summary

    start = time.perf_counter()
    row: dict[str, Any] = {"run_id": run_id(point), **point}
    try:
        flags = {k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in DISAGG_KEYS
                 and k not in FLEET_FLAGS}
        cfg = make_config(config, **flags)
        tr = workload(point, trace)
        if point.get("prefill_replicas") is not None or point.get("decode_replicas") is not None:
            from kvsim.fleet.disagg_plan import disagg_row
            row.update({**config_row(cfg), **point, **disagg_row(tr, cfg, point)})
        else:
            summary = run_summary(tr, cfg, fleet_from_flags(point))    # a row needs the summary only
            row.update({**config_row(cfg), **point, **summary_row(summary)})
        row.update(status="ok", error="")
    except Exception as exc:  # noqa: BLE001 - a failing point is a recorded row, never a stopped grid
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    row["wall_s"] = time.perf_counter() - start
    return row


def run_local(points: list[dict], trace: Trace | None, workers: int, on_row: Callable[[dict], None],
              config: SimConfig | None = None, on_started: Callable[[], None] | None = None) -> None:
    """Run `points` on `workers` processes (1: in this process; they die with it, see
    `kvsim.planning.pool`), handing each row to `on_row` as it finishes; `trace` and `config` are sent
    to each worker once. `on_started` is called once the workers exist."""
    run_pool(run_point, points, (trace, config), workers, on_row, on_started)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def _row_check(trace: Trace | None) -> Callable[[dict, dict], str | None]:
    """`check(row, point)` for resumed rows: the row against the config its flags make and the number
    of requests in its point's trace (`sweep_store.check_row`)."""
    def check(row: dict, point: dict) -> str | None:
        try:
            cfg = make_config(None, **{k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in DISAGG_KEYS})
            config = {k: v for k, v in config_row(cfg).items() if k not in point}
        except (ValueError, OSError):
            config = None
        try:
            num = len(workload(point, trace))
        except (ValueError, OSError):
            num = None
        return store.check_row(row, point, config, num)
    return check


def run_sweep(grid: Mapping[str, Sequence], base: Mapping[str, Any] | None = None, *,
              trace: Trace | str | Path | None = None, preset: str | None = None,
              workers: int | None = None, ray: bool = False, ray_address: str | None = None,
              out_dir: str | Path | None = None, resume: bool = False, progress: bool = False,
              warn: Callable[[str], None] = _warn, **base_flags: Any) -> pd.DataFrame:
    """Run every point of `grid` (flag -> values) over `base` flags; one row per point, in grid order.

    Workload: `trace` (a Trace or a file), `preset` (Poisson arrivals; `rate` req/s, `duration_s`), or
    `trace`/`preset` keys in the grid. `workers` processes (default all cores; 1 runs here), or Ray tasks
    with `ray=True` (local instance) or `ray_address`. Extra keyword flags join `base`. Every value is
    checked against its key's type, every trace file read, before anything runs or is written; with
    `out_dir` the folder is locked while the sweep runs, and `resume` keeps the rows of `rows.jsonl`
    that are consistent with their points (`warn` is told of the others, which run again).
    `df.attrs["sweep"]` counts the points run, resumed and failed.

    >>> import kvsim
    >>> df = kvsim.run_sweep({"block_size": [16, 64]}, {"kv_gib": 12, "num_requests": 20},
    ...                      preset="alpaca", workers=1)
    >>> df[["block_size", "status", "requests_finished"]].values.tolist()
    [[16, 'ok', 20], [64, 'ok', 20]]
    """
    base = {**(base or {}), **base_flags}
    if preset is not None:
        base["preset"] = preset
    if isinstance(trace, (str, Path)):           # read once, here: a bad file stops the sweep at once
        from kvsim.trace.formats import load_trace
        base["trace"], trace = str(trace), load_trace(trace)
    points = grid_points(grid, base)
    if trace is not None and any(p.get("trace") != base.get("trace") for p in points):
        raise ValueError("give a TRACE or a grid key trace, not both")
    for path in dict.fromkeys(str(p["trace"]) for p in points if p.get("trace") is not None):
        if trace is None:
            _file_trace(path)                    # a grid's trace files: read (and checked) before any run
    for p in points:
        check_workload(p, have_trace=trace is not None)
    ids = [run_id(p) for p in points]
    if ray or ray_address:                       # before anything is written
        from kvsim.planning.ray_backend import check_address, check_ray
        check_ray()
        if ray_address:
            check_address(ray_address)
    out = None if out_dir is None else Path(out_dir)
    if out is None:
        return _run(points, ids, {}, trace, workers, ray, ray_address, None, progress)
    from kvsim.files import check_output_folder
    check_output_folder(out, "--out")
    out.mkdir(parents=True, exist_ok=True)
    lock = store.lock_folder(out, warn)
    try:
        store.clean_temps(out)
        if store.has_rows(out / ROWS_FILE) and not resume:
            raise ValueError(f"{out} already holds a sweep ({ROWS_FILE}); pass --resume to continue it, "
                             "or choose another folder")
        done = store.previous_rows(out / ROWS_FILE, dict(zip(ids, points)), _row_check(trace), warn)
        df = _run(points, ids, done, trace, workers, ray, ray_address, out, progress)
        store.write_table(df, out)
    finally:
        store.unlock_folder(out, lock)
    return df


def _run(points: list[dict], ids: list[str], done: dict[str, dict], trace: Trace | None,
         workers: int | None, ray: bool, ray_address: str | None, out: Path | None,
         progress: bool) -> pd.DataFrame:
    """Run the points not `done`, appending each row to out/rows.jsonl as it finishes; the table."""
    todo = [p for p, i in zip(points, ids) if i not in done]
    rows = dict(done)
    path = None if out is None else out / ROWS_FILE
    bars: list = []

    def start_bar() -> None:
        if progress and todo and (bar := _progress_bar(len(todo))) is not None:
            bars.append(bar)

    try:
        log = None if path is None else open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise store.write_error(path, exc) from None
    try:
        def on_row(row: dict) -> None:
            rows[row["run_id"]] = row
            if log is not None:
                try:
                    log.write(json.dumps(row, default=str) + "\n")
                    log.flush()
                except OSError as exc:
                    raise store.write_error(path, exc) from None
            for bar in bars:
                bar.advance(bar.task_ids[0])

        if ray or ray_address:
            from kvsim.planning.ray_backend import run_ray
            start_bar()
            run_ray(run_point, todo, trace, workers, ray_address, on_row)
        else:
            run_local(todo, trace, workers or os.cpu_count() or 1, on_row, on_started=start_bar)
    finally:
        for bar in bars:
            bar.stop()
        if log is not None:
            try:
                log.close()
            except OSError:
                pass
    df = pd.DataFrame([rows[i] for i in ids])
    df.attrs["sweep"] = {"points": len(ids), "resumed": len(done), "run": len(todo),
                         "failed": int((df.status != "ok").sum()) if len(df) else 0}
    return df


def _progress_bar(total: int):
    """A rich bar with done/total, elapsed time and ETA, on stderr; None when stderr is not a terminal."""
    import sys

    if not sys.stderr.isatty():
        return None
    from rich.console import Console
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                               TimeRemainingColumn)
    bar = Progress(TextColumn("sweep"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True))
    bar.add_task("runs", total=total)
    bar.start()
    return bar


def read_sweep(out_dir: str | Path) -> pd.DataFrame:
    """The table a finished sweep wrote into `out_dir` (results.parquet)."""
    return pd.read_parquet(Path(out_dir) / PARQUET_FILE)


__all__: Iterable[str] = ("run_sweep", "grid_points", "run_point", "run_id", "workload", "read_sweep",
                          "run_local", "WORKLOAD_KEYS", "ROWS_FILE", "PARQUET_FILE", "CSV_FILE")
