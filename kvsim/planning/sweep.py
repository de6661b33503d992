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

import hashlib
import itertools
import json
import os
import time
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from kvsim.planning.runs import config_row, make_config, normalize_flag, run_flags, summary_row
from kvsim.planning.vllm_flags import IGNORED
from kvsim.engine.config import SimConfig
from kvsim.fleet.config import FLEET_FLAGS, fleet_from_flags
from kvsim.trace.table import Trace

#: Grid keys that shape the workload rather than the configuration.
WORKLOAD_KEYS = ("trace", "preset", "rate", "time_scale", "duration_s", "num_requests", "max_requests")
ROWS_FILE, PARQUET_FILE, CSV_FILE = "rows.jsonl", "results.parquet", "results.csv"


def grid_points(grid: Mapping[str, Sequence], base: Mapping[str, Any] | None = None) -> list[dict]:
    """The cross product of `grid` (in key order, last key fastest), each point merged over `base`.

    >>> grid_points({"block_size": [8, 16], "allocator": ["paged"]}, {"kv_gib": 12})
    [{'kv_gib': 12, 'block_size': 8, 'allocator': 'paged'}, {'kv_gib': 12, 'block_size': 16, 'allocator': 'paged'}]
    """
    known = set(run_flags()) | set(WORKLOAD_KEYS) | IGNORED | set(FLEET_FLAGS)   # (IGNORED: vLLM flags kvsim
                                                                                 # ignores; fleet: kvsim/fleet/config.py)
    grid = {normalize_flag(k): list(v) for k, v in grid.items()}
    base = {normalize_flag(k): v for k, v in (base or {}).items()}
    if not grid:
        raise ValueError("empty grid: give at least one --grid flag=v1,v2")
    for key in [*grid, *base]:
        if key not in known:
            raise ValueError(f"unknown flag {key!r} in the grid; known: {', '.join(sorted(known))}")
    for key, values in grid.items():
        if not values:
            raise ValueError(f"empty grid: flag {key!r} has no values")
    return [{**base, **dict(zip(grid, combo))} for combo in itertools.product(*grid.values())]


def run_id(point: Mapping[str, Any]) -> str:
    """A stable 12-hex-digit id of a grid point (the same point gives the same id in every sweep)."""
    text = json.dumps({k: point[k] for k in sorted(point)}, default=str, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


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
        flags = {k: v for k, v in point.items() if k not in WORKLOAD_KEYS and k not in FLEET_FLAGS}
        cfg = make_config(config, **flags)
        tr = workload(point, trace)
        summary = run_summary(tr, cfg, fleet_from_flags(point))    # a row needs the summary only
        row.update({**config_row(cfg), **point, **summary_row(summary)})
        row.update(status="ok", error="")
    except Exception as exc:  # noqa: BLE001 - a failing point is a recorded row, never a stopped grid
        row.update(status="error", error=f"{type(exc).__name__}: {exc}")
    row["wall_s"] = time.perf_counter() - start
    return row


_WORKER_ARGS: tuple[Trace | None, SimConfig | None] = (None, None)


def _init_worker(trace: Trace | None, config: SimConfig | None) -> None:
    global _WORKER_ARGS
    _WORKER_ARGS = (trace, config)


def _run_in_worker(point: dict) -> dict:
    return run_point(point, *_WORKER_ARGS)


def run_local(points: list[dict], trace: Trace | None, workers: int, on_row: Callable[[dict], None],
              config: SimConfig | None = None, on_started: Callable[[], None] | None = None) -> None:
    """Run `points` on `workers` processes (1: in this process), handing each row to `on_row` as it
    finishes; `trace` and `config` are sent to each worker once. `on_started` is called once the
    workers exist (a progress bar's thread must not be running when they fork)."""
    if workers == 1:
        if on_started is not None:
            on_started()
        for p in points:
            on_row(run_point(p, trace, config))
        return
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=workers, initializer=_init_worker,
                             initargs=(trace, config)) as pool:
        futures = [pool.submit(_run_in_worker, p) for p in points]
        if on_started is not None:
            on_started()
        for fut in as_completed(futures):
            on_row(fut.result())


def _previous_rows(path: Path) -> dict[str, dict]:
    """Rows already in rows.jsonl by run_id (the last one wins; a torn last line is skipped)."""
    rows: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            rows[row["run_id"]] = row
    return rows


def _write_table(df: pd.DataFrame, out_dir: Path) -> None:
    """results.parquet and results.csv, each written whole (temporary name, then rename)."""
    for name, write in ((PARQUET_FILE, lambda p: df.to_parquet(p, index=False)),
                        (CSV_FILE, lambda p: df.to_csv(p, index=False))):
        tmp = out_dir / f".{name}.tmp"
        write(tmp)
        os.replace(tmp, out_dir / name)


def run_sweep(grid: Mapping[str, Sequence], base: Mapping[str, Any] | None = None, *,
              trace: Trace | str | Path | None = None, preset: str | None = None,
              workers: int | None = None, ray: bool = False, ray_address: str | None = None,
              out_dir: str | Path | None = None, resume: bool = False, progress: bool = False,
              **base_flags: Any) -> pd.DataFrame:
    """Run every point of `grid` (flag -> values) over `base` flags; one row per point, in grid order.

    Workload: `trace` (a Trace or a file), `preset` (Poisson arrivals; `rate` req/s, `duration_s`), or
    `trace`/`preset` keys in the grid. `workers` processes (default all cores; 1 runs here), or Ray tasks
    with `ray=True` (local instance) or `ray_address`. Extra keyword flags join `base`.

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
    ids = [run_id(p) for p in points]
    if ray_address:                      # before anything is written
        from kvsim.planning.ray_backend import check_address
        check_address(ray_address)
    out = None if out_dir is None else Path(out_dir)
    done: dict[str, dict] = {}
    if out is not None:
        if (out / ROWS_FILE).exists() and not resume:
            raise ValueError(f"{out} already holds a sweep ({ROWS_FILE}); pass --resume to continue it, "
                             "or choose another folder")
        out.mkdir(parents=True, exist_ok=True)
        wanted = set(ids)
        done = {k: r for k, r in _previous_rows(out / ROWS_FILE).items()
                if k in wanted and r.get("status") == "ok"}
    todo = [p for p, i in zip(points, ids) if i not in done]
    rows = dict(done)
    log = None if out is None else open(out / ROWS_FILE, "a", encoding="utf-8")
    bars: list = []

    def start_bar() -> None:
        if progress and todo and (bar := _progress_bar(len(todo))) is not None:
            bars.append(bar)

    try:
        def on_row(row: dict) -> None:
            rows[row["run_id"]] = row
            if log is not None:
                log.write(json.dumps(row, default=str) + "\n")
                log.flush()
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
            log.close()
    df = pd.DataFrame([rows[i] for i in ids])
    if out is not None:
        _write_table(df, out)
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
                          "WORKLOAD_KEYS")
