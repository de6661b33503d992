"""Ceilings and range checks for the numbers the commands take, checked before any work starts.

A value outside its range would change an answer silently (`--rel-tol nan` ends a search at once, a
negative `--max-requests` drops requests from the end) or make the work unbounded (`--gpus-for 1e12`,
`trace gen --num-requests 100000000` run until memory is gone). Each check raises ValueError naming the
flag, the value and the range, ceiling included, which the CLI prints as one line with exit status 2.

The ceilings bound memory, not what is physically sensible: a trace holds about 60 bytes per request in
its arrays (kvsim.trace.table.Trace: arrival, prompt, output, n, beam width, prefix columns) and the
simulator about 1 KB per live request, so MAX_REQUESTS traces fit in well under 16 GB.
"""

from __future__ import annotations

import math

#: Most requests in one generated or simulated trace (memory, see the module docstring).
MAX_REQUESTS = 10_000_000
#: Highest request rate any command takes, req/s: a fleet serving 10^5 req/s is far beyond any
#: published deployment (the vLLM paper's highest rate is ~2 req/s per GPU; 10^5 would be ~50,000 GPUs).
MAX_RATE_RPS = 1e5
#: Longest trace, seconds (30 days).
MAX_DURATION_S = 30 * 86400.0
#: Most parallel samples or beams per request (vLLM sets no limit; the vLLM paper's widest is 6 beams):
#: bounds the sequences one request makes.
MAX_SAMPLES = 1024
#: Longest request, tokens (10^7: ten times the longest context window of a released model, 1M).
MAX_TOKENS = 10_000_000
#: Most processes one command starts: the one cap on per-unit counts (replicas, GPUs, workers).
from kvsim.fleet.config import MAX_UNITS as MAX_WORKERS  # noqa: E402


def number(value: float | int | None, flag: str, *, low: float = 0.0, high: float = math.inf,
           low_open: bool = True, unit: str = "") -> None:
    """ValueError unless `value` (when given) is finite and in (low, high] (or [low, high] when not
    `low_open`); the message names `flag`, the value and the range with its unit."""
    if value is None:
        return
    lo = f"> {_show(low)}" if low_open else f">= {_show(low)}"
    rng = lo + (f" and <= {_show(high)}" if math.isfinite(high) else "") + (f" {unit}" if unit else "")
    try:
        ok = math.isfinite(value) and (value > low if low_open else value >= low) and value <= high
    except TypeError:
        ok = False
    if not ok:
        raise ValueError(f"{flag} {value}: must be a finite number {rng}")


def _show(x: float) -> str:
    """1e7 -> '10,000,000', 0.5 -> '0.5'."""
    return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e16 else f"{x:g}"


def rate(value: float | None, flag: str = "--rate") -> None:
    """A request rate, req/s: finite, > 0, at most MAX_RATE_RPS."""
    number(value, flag, high=MAX_RATE_RPS, unit="req/s")


def duration(value: float | None, flag: str = "--duration") -> None:
    """A trace length, seconds: finite, > 0, at most MAX_DURATION_S."""
    number(value, flag, high=MAX_DURATION_S, unit="s")


def count(value: int | None, flag: str, high: int = MAX_REQUESTS, low: int = 1) -> None:
    """A whole number in [low, high]."""
    number(value, flag, low=low, high=high, low_open=False)


def requests(rate_rps: float | None, duration_s: float | None, what: str) -> None:
    """ValueError when `rate_rps` x `duration_s` (the expected number of Poisson arrivals) exceeds
    MAX_REQUESTS; `what` names the flags."""
    if rate_rps is not None and duration_s is not None and rate_rps * duration_s > MAX_REQUESTS:
        raise ValueError(f"{what}: {rate_rps:g} req/s x {duration_s:g} s is {rate_rps * duration_s:,.0f} requests, "
                         f"more than the ceiling of {MAX_REQUESTS:,}; lower the rate or the duration")


def workers(value: int | None, flag: str = "--workers") -> None:
    """A process count: 1..MAX_WORKERS."""
    count(value, flag, high=MAX_WORKERS)


def capacity_flags(gpus_for: float | None, duration_s: float, rel_tol: float, max_runs: int,
                   workers_: int | None, seed: int, preset: bool) -> None:
    """The numbers of `kvsim capacity`, before any work: `--gpus-for` a rate up to MAX_RATE_RPS,
    `--duration` up to MAX_DURATION_S (and, for a --preset trace, rate x duration up to MAX_REQUESTS),
    `--rel-tol` in (0, 1), `--max-runs` up to 1000."""
    rate(gpus_for, "--gpus-for")
    duration(duration_s)
    if preset:
        requests(gpus_for, duration_s, "--gpus-for x --duration")
    number(rel_tol, "--rel-tol", high=0.999)
    count(max_runs, "--max-runs", high=1000)
    workers(workers_)
    count(seed, "--seed", low=0, high=2**63 - 1)
