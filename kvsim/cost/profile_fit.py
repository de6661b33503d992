"""Fit an engine profile's CPU constants to measured step times (`kvsim calibrate-engine`).

The CSV (header row, one row per measurement, any extra columns ignored):
- `batch_size`: sequences in the step (int >= 1);
- either `cpu_ms`: the step's CPU time (scheduling, input preparation, sampling, output processing),
  as Vidur's cpu_overheads.csv or a profiler gives it;
- or `step_ms`: the whole step time or inter-token latency of decode steps (from a server's logs or a
  benchmark), with `context_tokens`: the mean KV tokens per sequence then. kvsim subtracts its kernel
  time for that decode batch (the cost model of `--model/--gpu/--tp`, no CPU time) to get the CPU time.
The fit is least squares of cpu_s = cpu_step_s + cpu_seq_s x batch_size, both kept >= 0. Seconds.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True, slots=True)
class EngineFit:
    """Fitted CPU constants (seconds) and how well they fit (root-mean-square error, seconds)."""

    cpu_step_s: float
    cpu_seq_s: float
    rms_error_s: float
    rows: int


def read_cpu_times(path: str | Path, kernel_seconds=None) -> tuple[np.ndarray, np.ndarray]:
    """(batch sizes, CPU seconds per step) from the CSV at `path`; `kernel_seconds(batch, context)`
    gives the kernel time of a decode step for `step_ms` files. Errors name the file, line and column."""
    path = Path(path)
    try:
        with path.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise ValueError(f"{path}: cannot read step times: {exc}") from None
    if not rows:
        raise ValueError(f"{path}: no rows (need a header and at least two measurements)")
    columns = set(rows[0])
    if "batch_size" not in columns or not ({"cpu_ms", "step_ms"} & columns):
        raise ValueError(f"{path}: needs a batch_size column and a cpu_ms or step_ms column, got "
                         f"{', '.join(sorted(c for c in columns if c))}")
    direct = "cpu_ms" in columns
    if not direct and "context_tokens" not in columns:
        raise ValueError(f"{path}: step_ms needs a context_tokens column (mean KV tokens per sequence)")
    if not direct and kernel_seconds is None:
        raise ValueError(f"{path}: step_ms needs a model and GPU to subtract kernel time")
    batches, cpu = [], []
    for line, row in enumerate(rows, start=2):
        def number(column: str) -> float:
            try:
                value = float(row[column])
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: column {column!r}: not a number: {row[column]!r}") from None
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{path}:{line}: column {column!r}: must be a finite number >= 0, got {value}")
            return value
        batch = number("batch_size")
        if batch < 1 or batch != int(batch):
            raise ValueError(f"{path}:{line}: column 'batch_size': must be an integer >= 1, got {row['batch_size']}")
        if direct:
            seconds = number("cpu_ms") / 1e3
        else:
            seconds = number("step_ms") / 1e3 - kernel_seconds(int(batch), number("context_tokens"))
        batches.append(int(batch))
        cpu.append(seconds)
    if len(set(batches)) < 2:
        raise ValueError(f"{path}: need measurements at two batch sizes at least")
    return np.array(batches, dtype=float), np.array(cpu)


def fit_cpu(batches: np.ndarray, cpu_s: np.ndarray) -> EngineFit:
    """Least-squares cpu_s = a + b x batch with a, b >= 0 (a line through the origin, or a constant,
    when the free fit makes one negative)."""
    design = np.c_[np.ones_like(batches), batches]
    (a, b), *_ = np.linalg.lstsq(design, cpu_s, rcond=None)
    if b < 0:
        a, b = max(float(cpu_s.mean()), 0.0), 0.0
    elif a < 0:
        a, b = 0.0, max(float(batches @ cpu_s / (batches @ batches)), 0.0)
    rms = float(np.sqrt(np.mean((a + b * batches - cpu_s) ** 2)))
    return EngineFit(float(a), float(b), rms, len(batches))


def write_profile(out: Path, base: str, fit: EngineFit, source: str, flag: str | None = None) -> None:
    """The fitted profile as JSON (read by `--engine-profile FILE.json`), written whole or not at all
    (an I/O error names `out` and, given, the `flag` that chose it)."""
    data = {"name": out.stem, "base": base, "cpu_step_s": fit.cpu_step_s, "cpu_seq_s": fit.cpu_seq_s,
            "rms_error_s": fit.rms_error_s, "rows": fit.rows, "source": source}
    from kvsim.files import write_json_atomic
    write_json_atomic(out, data, flag, end="\n")
