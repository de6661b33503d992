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
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from kvsim.engine.config import SimConfig
from kvsim.planning import run_cache
from kvsim.planning.sweep import store
from kvsim.planning.sweep.pool import run_pool
from kvsim.planning.runs import config_row, make_config
from kvsim.planning.sweep.grid import DISAGG_KEYS, WORKLOAD_KEYS, check_workload, grid_points, run_id
from kvsim.planning.sweep.point import (_file_trace, _preset_trace, point_row, run_point, shared_row,  # noqa: F401
                                        run_point_parts, workload)
from kvsim.planning.sweep.store import CSV_FILE, PARQUET_FILE, ROWS_FILE
from kvsim.trace.table import Trace


def run_local(points: list[dict], trace: Trace | None, workers: int, on_row: Callable[[dict], None],
              config: SimConfig | None = None, on_started: Callable[[], None] | None = None) -> None:
    """Run `points` on `workers` processes (1: in this process; they die with it, see
    `kvsim.planning.sweep.pool`), handing each row to `on_row` as it finishes; `trace` and `config` are sent
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
    from kvsim.planning.sweep.servable import check_servable
    check_servable(points, warn)                 # no point servable: stop here, before anything is written
    ids = [run_id(p) for p in points]
    if ray or ray_address:                       # before anything is written
        from kvsim.planning.sweep.ray_backend import check_address, check_ray
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
    """The table of `_rows` (one row per point, in order), its counts in `attrs["sweep"]`."""
    rows, counts = _rows(points, ids, done, trace, workers, ray, ray_address, out, progress)
    df = pd.DataFrame(rows)
    df.attrs["sweep"] = {**counts, "failed": int((df.status != "ok").sum()) if len(df) else 0}
    return df


def run_points(points: list[dict], *, trace: Trace | None = None,
               workers: int | None = None) -> list[dict]:
    """Rows of explicit points (each as `grid_points` makes them; a point listed twice, or two points
    that make the same run, run once), in order, on `workers` processes (default all cores): several
    grids of one study run as one pool, so no worker idles while a grid's last run ends."""
    for p in points:
        check_workload(p, have_trace=trace is not None)
    return _rows(points, [run_id(p) for p in points], {}, trace, workers, False, None, None, False)[0]


def _rows(points: list[dict], ids: list[str], done: dict[str, dict], trace: Trace | None,
          workers: int | None, ray: bool, ray_address: str | None, out: Path | None,
          progress: bool) -> tuple[list[dict], dict]:
    """Run the points not `done` (a run made before in this process, or twice here, is made once:
    `kvsim.planning.run_cache`), appending each row to out/rows.jsonl as it comes; the rows in the
    order of `ids`, and the counts of points, resumed, run and shared."""
    todo = [p for p, i in zip(points, ids) if i not in done]
    rows = dict(done)
    path = None if out is None else out / ROWS_FILE
    bars: list = []
    keys: dict[str, str | None] = {}            # run_id of a point run now -> its run's key
    sharing: dict[str, list[dict]] = {}         # key -> points whose row comes from that one run
    hits, run_now = [], []
    for p in todo:
        key = run_cache.point_key(p, trace if p.get("preset") is None and trace is not None
                                  else None if p.get("preset") is not None else _file_trace(str(p["trace"])))
        parts = run_cache.lookup(key)
        if parts is not None:
            hits.append(point_row(p, parts))
        elif key is not None and key in sharing:
            sharing[key].append(p)
        else:
            keys[run_id(p)] = key
            sharing.setdefault(key, []) if key is not None else None
            run_now.append(p)

    def start_bar() -> None:
        if progress and todo and (bar := _progress_bar(len(todo))) is not None:
            bars.append(bar)

    try:
        log = None if path is None else open(path, "a", encoding="utf-8")
    except OSError as exc:
        raise store.write_error(path, exc) from None
    try:
        def emit(row: dict) -> None:
            rows[row["run_id"]] = row
            if log is not None:
                try:
                    log.write(json.dumps(row, default=str) + "\n")
                    log.flush()
                except OSError as exc:
                    raise store.write_error(path, exc) from None
            for bar in bars:
                bar.advance(bar.task_ids[0])

        def on_row(made: tuple[dict, tuple[dict, dict] | None]) -> None:
            row, parts = made
            key = keys.get(row["run_id"])
            run_cache.store(key, parts)
            emit(row)
            for p in sharing.get(key, ()) if key is not None else ():
                emit(shared_row(p, made))

        for row in hits:
            emit(row)
        if ray or ray_address:
            from kvsim.planning.sweep.ray_backend import run_ray
            start_bar()
            run_ray(run_point_parts, run_now, trace, workers, ray_address, on_row)
        else:
            run_pool(run_point_parts, run_now, (trace, None), workers or os.cpu_count() or 1, on_row,
                     start_bar)
    finally:
        for bar in bars:
            bar.stop()
        if log is not None:
            try:
                log.close()
            except OSError:
                pass
    return [rows[i] for i in ids], {"points": len(ids), "resumed": len(done), "run": len(run_now),
                                    "shared": len(todo) - len(run_now)}


def _progress_bar(total: int):
    """A rich bar with done/total, elapsed time and ETA, on stderr; plain lines
    (`kvsim.planning.progress_lines`) when stderr is not a terminal."""
    import sys

    if not sys.stderr.isatty():
        from kvsim.planning.progress_lines import Lines
        return Lines("sweep", total)
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


__all__: Iterable[str] = ("run_sweep", "run_points", "grid_points", "run_point", "run_id", "workload", "read_sweep",
                          "run_local", "WORKLOAD_KEYS", "ROWS_FILE", "PARQUET_FILE", "CSV_FILE")
