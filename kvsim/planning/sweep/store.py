"""A sweep's output folder: a lock while a sweep writes it, `rows.jsonl` read back and checked for
`--resume`, and the results table written whole.

The lock is `flock` on `.sweep.lock` (the holder's pid inside): the kernel drops it when its process dies,
SIGKILL included, so a second sweep on a busy folder is refused naming the holder, and a lock file left
by a dead sweep is taken over (and said so). On resume every line of `rows.jsonl` is read: lines that
are not JSON objects with a `run_id` are dropped with a warning (a cut-off last line is an interrupted
write), and a finished row of the grid is kept only when `check_row` finds it consistent with its point;
the others run again, named. A file with dropped lines is rewritten whole before new rows are appended.
"""

from __future__ import annotations

import errno
import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from kvsim.files import atomic_write

ROWS_FILE, PARQUET_FILE, CSV_FILE, LOCK_FILE = "rows.jsonl", "results.parquet", "results.csv", ".sweep.lock"

#: Columns every finished row has; requests_* are counts of the point's trace.
SUMMARY_KEYS = ("requests_total", "requests_finished", "requests_rejected", "duration_s", "throughput_rps",
                "throughput_tokens_per_s", "normalized_latency_s_per_token", "wall_s")


def write_error(path: Path, exc: OSError) -> ValueError:
    """The one-line error for an OSError while writing `path` (names the final path, never a temp)."""
    return ValueError(f"--out {path}: cannot write: {exc.strerror or exc}")


_HELD: set[int] = set()             # lock descriptors this process holds


def _close_held_in_child() -> None:
    """A forked worker closes its copies of the lock, so the lock ends with the sweep process itself."""
    for fd in _HELD:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def lock_folder(folder: Path, note: Callable[[str], None]) -> int:
    """Take the folder's sweep lock (a file descriptor to pass to `unlock_folder`); ValueError naming
    the holder's pid when a live sweep holds it."""
    import fcntl

    path = folder / LOCK_FILE
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _pid_in(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            raise ValueError(f"--out {folder}: another sweep (pid {holder or '?'}) is writing this folder; "
                             "wait for it to finish or stop it, then run again with --resume") from None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:                                 # not a file its last holder removed as we opened it
            break
        os.close(fd)
    old = _pid_in(fd)
    if old and old != os.getpid():
        note(f"took over the lock of sweep pid {old} on {folder}, which is no longer running")
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    _HELD.add(fd)
    return fd


def clean_temps(folder: Path) -> None:
    """Remove the temporary files of killed sweeps (`.rows.jsonl.*.tmp`, `.results.parquet.*tmp`, ...);
    called with the lock held, so no live sweep is writing them."""
    for name in (ROWS_FILE, PARQUET_FILE, CSV_FILE):
        for tmp in folder.glob(f".{name}.*tmp"):
            try:
                tmp.unlink()
            except OSError:
                pass


def unlock_folder(folder: Path, fd: int) -> None:
    """Remove the lock file and release the lock."""
    try:
        if os.fstat(fd).st_ino == os.stat(folder / LOCK_FILE).st_ino:
            os.unlink(folder / LOCK_FILE)
    except OSError:
        pass
    _HELD.discard(fd)
    os.close(fd)


def _pid_in(fd: int) -> int | None:
    text = os.pread(fd, 32, 0).decode(errors="replace").strip()
    return int(text) if text.isdigit() else None


def has_rows(path: Path) -> bool:
    """Whether `path` (rows.jsonl) holds anything (an empty file is no sweep)."""
    return path.is_file() and path.stat().st_size > 0 and bool(path.read_bytes().strip())


def previous_rows(path: Path, wanted: Mapping[str, dict], check: Callable[[dict, dict], str | None],
                  note: Callable[[str], None]) -> dict[str, dict]:
    """The finished rows of `wanted` (run_id -> point) in `path` that `check(row, point)` passes (it
    returns a problem or None), by run_id (the last line wins); `path` is rewritten without the lines
    dropped (not JSON objects with a run_id, a cut-off last line, rows that fail the check)."""
    if not path.exists():
        return {}
    text = path.read_bytes().decode("utf-8", errors="replace")
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    keep: list[str] = []
    rows: dict[str, dict] = {}
    dirty = bool(text) and not text.endswith("\n")
    for i, line in enumerate(lines, 1):
        if not line.strip():
            dirty = True
            continue
        try:
            row = json.loads(line)
            problem = None if isinstance(row, dict) else "is not a JSON object"
        except ValueError:
            row, problem = None, ("is cut off (an interrupted write)" if i == len(lines) and dirty
                                  else "is not JSON")
        if problem is None and not isinstance(row.get("run_id"), str):
            problem = "has no run_id"
        rid = row["run_id"] if problem is None else None
        if problem is None and rid in wanted and row.get("status") == "ok":
            problem = check(row, wanted[rid])
            if problem is not None:
                note(f"{path} line {i}: run {rid} ({_describe(wanted[rid])}) {problem}; running it again")
                rows.pop(rid, None)
                dirty = True
                continue
        if problem is not None:
            note(f"{path} line {i} {problem}; dropped")
            dirty = True
            continue
        keep.append(line)
        if rid in wanted:
            rows[rid] = row
    if dirty:
        try:
            with atomic_write(path) as f:
                f.write("".join(x + "\n" for x in keep))
        except OSError as exc:
            raise write_error(path, exc) from None
    return {k: r for k, r in rows.items() if r.get("status") == "ok"}


def _describe(point: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in point.items())


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return a == b and (type(a) is type(b) or {type(a), type(b)} <= {int, float})


def check_row(row: Mapping[str, Any], point: Mapping[str, Any], config: Mapping[str, Any] | None,
              num_requests: int | None) -> str | None:
    """Why a finished `row` cannot stand for `point` (None when it can): a flag that differs from the
    point its run_id names, a config column that differs from what its flags give (`config`; None when
    they no longer make one), a missing summary column, a count that does not fit its trace
    (`num_requests`), a number that is negative, infinite or NaN."""
    for key, value in point.items():
        if not _same(row.get(key), value):
            return f"has {key}={row.get(key)!r}, its run id says {value!r}"
    if config is None:
        return "has flags that no longer make a valid configuration"
    for key, value in config.items():
        if not _same(row.get(key), value):
            return f"has {key}={row.get(key)!r}, its flags give {value!r}"
    for key in SUMMARY_KEYS:
        if key not in row:
            return f"has no {key}"
    for key, value in row.items():
        if isinstance(value, (dict, list)):
            return f"has a {type(value).__name__} in {key}"
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in config \
                and not (math.isfinite(value) and value >= 0):
            return f"has {key}={value!r} (a count, time or rate must be finite and >= 0)"
    for key in ("requests_total", "requests_finished", "requests_rejected"):
        if not isinstance(row[key], int) or isinstance(row[key], bool):
            return f"has {key}={row[key]!r}, not a whole number"
    if num_requests is not None and row["requests_total"] != num_requests:
        return f"has requests_total={row['requests_total']}, its trace has {num_requests} requests"
    if row["requests_finished"] + row["requests_rejected"] > row["requests_total"]:
        return (f"has requests_finished={row['requests_finished']} and requests_rejected="
                f"{row['requests_rejected']} of {row['requests_total']} requests")
    return None


def write_table(df: pd.DataFrame, out_dir: Path) -> None:
    """results.parquet and results.csv, each written whole (a unique temporary name, then rename)."""
    df = _arrow_safe(df)
    for name, mode, write in ((PARQUET_FILE, "wb", lambda f: df.to_parquet(f, index=False)),
                              (CSV_FILE, "w", lambda f: df.to_csv(f, index=False))):
        try:
            with atomic_write(out_dir / name, mode, newline="" if mode == "w" else None) as f:
                write(f)
        except OSError as exc:
            raise write_error(out_dir / name, exc) from None


def _arrow_safe(df: pd.DataFrame) -> pd.DataFrame:
    """`df` with every column of mixed value types (e.g. rows written by an older kvsim) as text."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object:
            kinds = {type(v) for v in out[col] if v is not None and not (isinstance(v, float) and v != v)}
            if len(kinds) > 1 and not kinds <= {int, float}:
                out[col] = [None if v is None else str(v) for v in out[col]]
    return out
