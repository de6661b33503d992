"""One simulation: build the run from its configuration, drive it with the SimPy engine, and return
the records. The command line and the Python API both come through `simulate`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from kvsim.config import SimConfig, build_run
from kvsim.engine import Engine
from kvsim.metrics import StepLog, requests_frame, summarize
from kvsim.trace import Trace


@dataclass(slots=True)
class SimResult:
    """The summary dict (DESIGN.md keys) and the per-request and per-step tables."""

    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame


def simulate(trace: Trace, cfg: SimConfig, progress: Callable[[float], None] | None = None,
             cost=None, fast_forward: bool = True) -> SimResult:
    """Run `trace` through the configured deployment; deterministic for a given trace and config.
    `cost` replaces the configured cost model (golden tests pass a `ConstantCost`);
    `fast_forward=False` steps one at a time (the same results, slower; see kvsim/engine.py)."""
    parts = build_run(trace, cfg)
    log = StepLog()
    start = time.perf_counter()
    Engine(trace.arrival_s, parts.scheduler, cost or parts.cost, log, progress,
           fast_forward=fast_forward).run()
    wall = time.perf_counter() - start
    steps = log.frame()
    requests = requests_frame(parts.scheduler, trace)
    summary = summarize(requests, steps, parts.scheduler, parts.capacity_tokens, parts.block_size,
                        parts.capacity_tokens // parts.block_size, wall)
    return SimResult(summary, requests, steps)
