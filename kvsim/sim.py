"""One simulation from a resolved configuration: build allocator, scheduler, cost model and engine,
run them, and return the records. The CLI, sweeps and notebooks all come through `simulate`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Callable

import pandas as pd

from kvsim.alloc import make_allocator
from kvsim.calibration import Calibration
from kvsim.cost import CostModel
from kvsim.engine import Engine
from kvsim.metrics import StepLog, requests_frame, summarize
from kvsim.scheduler import Scheduler, SchedulerConfig
from kvsim.specs import GIB, Deployment
from kvsim.trace import Trace

ALLOCATORS = ("paged", "contiguous")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV cache: allocator kind and policy, block size (tokens), capacity source, CPU swap space."""

    allocator: str = "paged"
    block_size: int = 16
    reserve: str = "max"            # contiguous only: max | pow2 | oracle
    placement: str = "buddy"        # contiguous only: buddy | first-fit
    prefix_caching: bool = False
    kv_gib: float | None = None     # KV memory of the whole deployment, GiB
    num_blocks: int | None = None   # blocks of the whole deployment
    gpu_mem_util: float = 0.9
    swap_gib: float = 4.0           # CPU swap space per GPU, GiB (vLLM's default)

    def __post_init__(self) -> None:
        if self.allocator not in ALLOCATORS:
            raise ValueError(f"unknown allocator {self.allocator!r}; known: {', '.join(ALLOCATORS)}")
        if self.block_size < 1:
            raise ValueError(f"block size must be >= 1 token, got {self.block_size}")
        if self.swap_gib < 0:
            raise ValueError(f"swap space must be >= 0 GiB, got {self.swap_gib}")


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one run needs besides the trace."""

    deployment: Deployment
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    calibration: Calibration | None = None
    seed: int = 0

    def to_dict(self) -> dict:
        """The resolved configuration, JSON-ready (written as `config.json`)."""
        d = asdict(self)
        d["calibration"] = None if self.calibration is None else self.calibration.source
        return d


@dataclass(slots=True)
class SimResult:
    summary: dict
    requests: pd.DataFrame
    steps: pd.DataFrame


def simulate(trace: Trace, cfg: SimConfig, progress: Callable[[float], None] | None = None,
             cost=None) -> SimResult:
    """Run `trace` through the configured deployment; deterministic for a given trace and config.
    `cost` replaces the configured cost model (golden tests pass a `ConstantCost`)."""
    dep, cache = cfg.deployment, cfg.cache
    paged = cache.allocator == "paged"
    block_size = cache.block_size if paged else 1
    capacity = dep.kv_capacity_tokens(cache.kv_gib, cache.num_blocks, cache.block_size, cache.gpu_mem_util)
    if paged:
        capacity -= capacity % block_size
    alloc = make_allocator(cache.allocator, capacity, block_size=cache.block_size,
                           max_seq_len=dep.model.max_seq_len, reserve=cache.reserve,
                           placement=cache.placement, prefix_caching=cache.prefix_caching)
    swap_tokens = int(cache.swap_gib * GIB * dep.tp // dep.model.kv_bytes_per_token())
    block_ids = None
    if cache.prefix_caching:
        def block_ids(i: int) -> list[int]:
            return trace.prompt_block_ids(i, cache.block_size)
    sched = Scheduler(trace, alloc, cfg.scheduler, dep.model.max_seq_len, swap_tokens, block_ids)
    if cost is None:
        cost = CostModel(dep, cache.block_size, paged, cfg.calibration)
    log = StepLog()
    start = time.perf_counter()
    Engine(trace.arrival_s, sched, cost, log, progress).run()
    wall = time.perf_counter() - start
    steps = log.frame()
    requests = requests_frame(sched, trace)
    num_blocks = capacity // block_size
    summary = summarize(requests, steps, sched, capacity, block_size, num_blocks, wall)
    return SimResult(summary, requests, steps)
