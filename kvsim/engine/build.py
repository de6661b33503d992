"""The SimPy-free parts of one run (`build_run`: allocator, scheduler, cost model) from a trace and a
`SimConfig`; the SimPy engine (`kvsim.engine.sim`) and the GPU harness replay (which must not need SimPy)
both start from it. This is the one place in the engine that builds an allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.alloc import make_allocator
from kvsim.alloc.contiguous.groups import GroupedContiguousAllocator, GroupShare
from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.engine.config import SimConfig, async_scheduling_on, concurrent_batches, kv_cache_plan, kv_capacity
from kvsim.cost.adjusted import adjust_cost
from kvsim.cost.roofline import CostModel
from kvsim.cost.profiles import EngineProfile
from kvsim.cost.select import cost_model
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.specs.kv_groups import KVCachePlan, exports_prefill_checkpoints
from kvsim.specs.model import GIB
from kvsim.engine.batching.static import StaticScheduler
from kvsim.trace.table import Trace

if TYPE_CHECKING:      # (the hybrid manager's package is imported only by runs that build one)
    from kvsim.alloc.hybrid import GroupSpec


@dataclass(frozen=True, slots=True)
class RunParts:
    """The plain-Python pieces of one run; `capacity_tokens` is the KV size in slots."""

    allocator: object
    scheduler: Scheduler
    cost: CostModel
    capacity_tokens: int
    block_size: int
    profile: EngineProfile | None = None


def build_run(trace: Trace, cfg: SimConfig, scheduler_kind: type | None = None) -> RunParts:
    """Allocator, scheduler and cost model for `trace` under `cfg` (nothing has run yet). The engine
    profile sets the scheduler's policy (`SimConfig.resolved`) and the cost model's paged penalty
    and fixed step overhead; its CPU time per step is added by the stepper (`RunParts.profile`).
    `scheduler_kind`: a `Scheduler` subclass to build instead (the disaggregated instances')."""
    cfg = cfg.resolved()
    profile = cfg.engine_profile
    dep, cache = cfg.deployment, cfg.cache
    paged = cache.allocator == "paged"
    block_size = cache.block_size if paged else 1
    plan = kv_cache_plan(cfg) if paged else None
    if paged and cache.prefix_cache_retention_interval and (plan is None or hybrid_groups(plan) is None):
        # a positive interval on a paged cache without hybrid groups (the hybrid allocator checks its own;
        # 0 and none are always valid, so a plain run does not load the hybrid package)
        kinds = ["full"] if plan is None or not plan.hybrid else [g.kind for g in plan.groups]
        from kvsim.alloc.hybrid.retention import check_retention   # (the hybrid package loads only when used)
        check_retention(cache.prefix_cache_retention_interval, block_size if plan is None else plan.block_size,
                        kinds)
    if cache.allocator == "jenga":
        alloc = jenga_allocator(cfg)
        capacity, block_size = alloc.capacity_tokens, cache.block_size
    elif cache.allocator == "contiguous" and any(g.kind in ("sliding", "chunked", "mamba")
                                                 for g in dep.model.layer_groups):
        alloc = grouped_contiguous_allocator(cfg)     # each group reserves its own share
        capacity = alloc.capacity_tokens
    elif plan is None:
        capacity = kv_capacity(cfg)
        alloc = make_allocator(cache.allocator, capacity, block_size=cache.block_size,
                               max_seq_len=dep.model.max_seq_len, reserve=cache.reserve,
                               placement=cache.placement, prefix_caching=cache.prefix_caching,
                               cpu_tier_blocks=cpu_tier_blocks(cfg, cache.block_size))
    else:                           # layers other than full attention: vLLM's KV cache groups
        block_size = plan.block_size
        capacity = (plan.num_blocks - 1) * block_size     # vLLM's pool less its null block (block_pool.py)
        alloc = _plan_allocator(plan, cfg, capacity)
    if cache.cpu_kv_gib and (getattr(alloc, "cpu_tier", None) is None or cfg.scheduler.batching == "static"):
        raise ValueError("--cpu-kv-gib: the CPU tier keeps prefix-cache blocks: it needs prefix caching on the "
                         "paged cache of full-attention layers, under continuous batching")
    if getattr(alloc, "_kind", None) in ("hybrid", "jenga"):   # one sequence per request: say so up front
        from kvsim.trace.locate import check_one_sequence
        check_one_sequence(trace, alloc._kind, any(g.kind == "mamba" for g in dep.model.layer_groups))
    if getattr(alloc, "cpu_tier", None) is not None:
        alloc.cpu_tier.store_all = cache.cpu_kv_policy == "store-all"
    if hasattr(alloc, "record_groups"):     # KV cache groups: per-group memory in the summary
        alloc.record_groups = True
    swap_tokens = int(cache.swap_gib * GIB * dep.tp // dep.kv_bytes_per_token())
    if isinstance(alloc, GroupedContiguousAllocator):    # (its slots are `unit_bytes` each, per GPU)
        swap_tokens = int(cache.swap_gib * GIB // alloc.unit_bytes)
    block_ids = None
    page = cache.block_size if plan is None else plan.block_size     # tokens per block (attention)
    if cache.prefix_caching:
        if not trace.shares_prompt_blocks:
            def block_ids(i: int) -> tuple[()]:
                return ()           # (`prompt_block_ids` is empty for every request)
        else:
            def block_ids(i: int) -> list[int]:
                return trace.prompt_block_ids(i, page)
    kind = StaticScheduler if cfg.scheduler.batching == "static" else Scheduler
    if kind is Scheduler and profile.policy == "vllm-0.1.4" and type(alloc) is PagedAllocator \
            and not cache.prefix_caching:
        from kvsim.engine.batching.vllm2023.scheduler import SchedulerV0
        kind = SchedulerV0          # vLLM 0.1.4's policy (the vllm-2023 profile on paged memory)
    kind = scheduler_kind or kind
    sched = kind(trace, alloc, cfg.scheduler, dep.model.max_seq_len, swap_tokens, block_ids, cfg.seed)
    if profile.time_model == "vllm-v1" and kind is Scheduler and async_scheduling_on(cfg):
        # async scheduling: each step planned while the one before runs, so it admits only what had
        # arrived when that one started (`Stepper.step`'s cutoff) and sees none of its outputs
        # (finished requests held one step, settle.py, checked against vLLM step by step)
        sched.async_lag, sched.arrival_times = True, trace.arrival_s.tolist()
        sched.use_async_scheduling()
    penalty = paged and (profile.paged_penalty or cfg.calibration is not None)   # measured kernels win
    cost = cost_model(dep, page, penalty, cfg.calibration, profile, cfg.scheduler.max_num_seqs,
                      cfg.scheduler.max_batched_tokens, cfg.enforce_eager, async_scheduling_on(cfg))
    cost = adjust_cost(cost, profile, dep)      # a calibrated profile's fitted GPU-side parameters
    return RunParts(alloc, sched, cost, capacity, block_size, profile)


#: Host memory per GPU that bounds --cpu-kv-gib plus --swap-gib: NVIDIA's DGX H100, DGX H200 and DGX
#: A100 640GB carry 2 TB of system memory for 8 GPUs (NVIDIA DGX datasheets), bytes.
HOST_BYTES_PER_GPU = 2e12 / 8


def cpu_tier_blocks(cfg: SimConfig, block_size: int) -> int:
    """Blocks of `block_size` tokens (all layers, every TP rank) that `--cpu-kv-gib` holds; ValueError
    when it and the swap space together exceed the host memory of the deployment's GPUs."""
    cache, dep = cfg.cache, cfg.deployment
    if not cache.cpu_kv_gib:
        return 0
    host = HOST_BYTES_PER_GPU * dep.tp
    if (cache.cpu_kv_gib + cache.swap_gib * dep.tp) * GIB > host:
        raise ValueError(f"--cpu-kv-gib {cache.cpu_kv_gib:g} (with --swap-gib {cache.swap_gib:g} per GPU) is more "
                         f"than the host memory of {dep.tp} GPU(s), {host / GIB:.0f} GiB (a DGX's 2 TB for 8 GPUs)")
    return int(cache.cpu_kv_gib * GIB // (dep.kv_bytes_per_token() * block_size))


def hybrid_groups(plan: KVCachePlan) -> list[GroupSpec] | None:
    """The allocator's KV cache groups for `plan` (vLLM's group order; MLA pages like full attention),
    or None when every group keeps every token (one group, or the hybrid manager off): a plain paged
    pool of `plan.num_blocks` blocks then behaves as vLLM does."""
    if not plan.hybrid or all(g.kind in ("full", "mla") for g in plan.groups):
        return None
    from kvsim.alloc.hybrid import GroupSpec
    return [GroupSpec("full" if g.kind == "mla" else g.kind, window=g.window or 0, chunk=g.chunk or 0)
            for g in plan.groups]


def _plan_allocator(plan: KVCachePlan, cfg: SimConfig, capacity: int):
    """The allocator over `plan`'s pool: vLLM's hybrid KV cache manager (`kvsim.alloc.hybrid`) for
    groups that free blocks (sliding, chunked) or hold a state (Mamba), else the paged allocator."""
    cache, sched = cfg.cache, cfg.scheduler
    groups = hybrid_groups(plan)
    if groups is None:
        return make_allocator("paged", capacity, block_size=plan.block_size, prefix_caching=cache.prefix_caching,
                              cpu_tier_blocks=cpu_tier_blocks(cfg, plan.block_size))
    return make_allocator("hybrid", capacity, block_size=plan.block_size, max_seq_len=plan.max_model_len,
                          prefix_caching=cache.prefix_caching, groups=groups,
                          max_in_flight_tokens=concurrent_batches(cfg) * sched.max_batched_tokens,
                          prefill_chunk_tokens=sched.max_batched_tokens if sched.chunked_prefill else None,
                          retention_interval=cache.prefix_cache_retention_interval,
                          mamba_checkpoints=exports_prefill_checkpoints(cfg.deployment.model))


def jenga_allocator(cfg: SimConfig):
    """Jenga's two-level allocator (`kvsim.alloc.jenga`) over the deployment's KV bytes per GPU: one group per
    layer kind and window, each with its natural page (its layers' K+V, or MLA latent, bytes for
    `block_size` tokens; a Mamba group's whole state per request), large pages their LCM."""
    from kvsim.alloc.jenga import groups_from_layers
    dep, cache, sched = cfg.deployment, cfg.cache, cfg.scheduler
    model, tp = dep.model, dep.tp
    pool = _kv_bytes_per_gpu(cfg)
    layers = []
    for g in model.groups:
        kind = "full" if g.kind == "mla" else g.kind
        per_layer = g.state.bytes_per_gpu(tp) if g.kind == "mamba" else g.page_bytes_per_token(tp, model.kv_bytes)
        layers += [(kind, g.window or g.chunk or 0, per_layer)] * g.num_layers
    groups = groups_from_layers(layers, cache.block_size)
    return make_allocator("jenga", 0, block_size=cache.block_size, max_seq_len=model.max_seq_len,
                          prefix_caching=cache.prefix_caching, groups=groups, pool_bytes=pool,
                          max_in_flight_tokens=concurrent_batches(cfg) * sched.max_batched_tokens,
                          prefill_chunk_tokens=sched.max_batched_tokens if sched.chunked_prefill else None)


def _kv_bytes_per_gpu(cfg: SimConfig) -> int:
    """KV bytes one GPU holds: `--kv-gib` / tp, `--num-blocks` blocks of full-attention pages, or what
    its memory leaves at `--gpu-mem-util`."""
    dep, cache = cfg.deployment, cfg.cache
    if cache.kv_gib is not None:
        if not 0 < cache.kv_gib < float("inf"):
            raise ValueError(f"--kv-gib must be positive and finite, got {cache.kv_gib}")
        return int(cache.kv_gib * GIB // dep.tp)
    if cache.num_blocks is not None:
        if cache.num_blocks < 1:
            raise ValueError(f"--num-blocks must be positive, got {cache.num_blocks}")
        return cache.num_blocks * cache.block_size * dep.model.kv_bytes_per_token(dep.tp)
    return int(dep.kv_memory_per_gpu(cache.gpu_mem_util, cfg.batch_limits()[1]))


def grouped_contiguous_allocator(cfg: SimConfig) -> GroupedContiguousAllocator:
    """Contiguous reservations per layer group (`kvsim.alloc.contiguous.groups`) over one GPU's KV bytes:
    full and MLA layers keep the reservation's every token, sliding layers their window, chunked layers
    their chunk, Mamba layers their state; slots of the gcd of those byte sizes."""
    from math import gcd
    dep, cache = cfg.deployment, cfg.cache
    model, tp = dep.model, dep.tp
    parts = []
    for g in model.layer_groups:
        if g.kind == "mamba":
            parts.append(("mamba", 0, g.state_bytes_per_request(tp)))
        else:
            kind = "full" if g.kind == "mla" else g.kind
            parts.append((kind, g.window or g.chunk or 0, g.bytes_per_token(tp, model.kv_bytes)))
    unit = gcd(*(b for _, _, b in parts))
    shares = [GroupShare(kind, span, b // unit) for kind, span, b in parts]
    return GroupedContiguousAllocator(_kv_bytes_per_gpu(cfg) // unit, model.max_seq_len, shares,
                                      reserve=cache.reserve, placement=cache.placement, unit_bytes=unit)
