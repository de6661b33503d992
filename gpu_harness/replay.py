"""Replay a trace on a real KV pool, driven block for block by kvsim's own step function.

Each engine step is the simulator's: `kvsim.engine.step.Stepper.step` schedules, times and finishes it (no
SimPy here; arrivals are added before each step) and returns its plan with the block tables of the
live sequences. `gpu_harness.layout` turns the plan into kernel inputs: its copy-on-write pairs run
through `copy_blocks`, its new tokens' K/V (random) are written with `store_kv` through slot mappings
built from the block tables, and `paged_decode` runs for every decoding sequence, layer by layer (a
beam that re-forked a surviving one, `plan.reforked`, takes a copy of its shadow before the writes and
reads the parent's physical blocks until copy-on-write gives it its own last block). On
sampled steps every decode output is compared with a torch reference over a contiguous shadow copy of
the same sequence's K/V.

What this proves, and what it does not: the block tables, copy-on-write pairs and slot mappings are
kvsim's, so the attention check proves that real kernels reading and writing through kvsim's block
tables compute the reference attention for every sequence (no block aliased between sequences, every
copy-on-write done before the write that needs it, prefix-cache hits holding what was written). The
memory check is made from the pool's side (`gpu_harness.pool_audit`): after each step's writes, every
token the harness wrote for a live sequence (sequences it tracks itself from the plan's events) is
read back bit for bit through that sequence's table, and the distinct blocks reachable from the live
tables are counted; that count is compared with kvsim's allocator counters for the same step (its
`used_blocks`) and, given `predicted_blocks`, with a separate kvsim run's steps.csv. An allocator that
double-books a block fails both: the readback (the second writer overwrote the first) and the count.
What stays kvsim's own: which sequences run when (the scheduler), and the block tables themselves.

A hybrid model (KV cache groups: sliding window, chunked local, Mamba beside full attention) replays
under kvsim's hybrid allocator (`kvsim.alloc.hybrid`, vLLM's hybrid KV cache manager): the plan carries
one table per group and sequence (`StepPlan.group_tables`), the pool (`gpu_harness.replay_pool`) pages
layer j of every group into the same tensor, each group writes its tokens through its own table (never
through a null entry: a skipped block) and decodes with its kernel (`paged_decode` with `window=W` or
`chunk=C`; a Mamba group pages nothing and is only counted), against the reference over the same
window. A table that would make a kernel write or read through a null entry ends the replay with that
step as its mismatch. Every group's layers share the replayed shape (`ReplayShape`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gpu_harness import layout
from gpu_harness.replay_pool import ReplayGroup, ReplayPool, TableError
from kvsim.alloc.hybrid import HybridAllocator
from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.engine.build import build_run
from kvsim.engine.config import SimConfig, kv_cache_plan
from kvsim.engine.step import Stepper
from kvsim.specs import ModelSpec
from kvsim.trace.table import Trace


@dataclass(frozen=True, slots=True)
class ReplayShape:
    """Attention shape of the replayed pool (per GPU) and how many layers get a real pool."""

    q_heads: int
    kv_heads: int
    head_dim: int
    num_layers: int
    dtype: torch.dtype

    @classmethod
    def of_model(cls, model: ModelSpec, tp: int, num_layers: int, dtype: torch.dtype) -> "ReplayShape":
        """The model's real per-GPU shape (heads split over `tp`), with `num_layers` layers."""
        return cls(model.num_heads // tp, max(model.num_kv_heads // tp, 1), model.head_dim,
                   num_layers, dtype)


#: The shape replayed on the CPU interpreter: small enough for a few hundred kernel steps.
TINY = ReplayShape(q_heads=4, kv_heads=2, head_dim=16, num_layers=1, dtype=torch.float32)


@dataclass(frozen=True, slots=True)
class ReplayReport:
    """What the replay found; `first_mismatch` says where the pool first disagreed with kvsim."""

    steps: int
    checked_steps: int
    tokens_written: int
    block_copies: int
    preemptions: int
    max_held_blocks: int
    verified_tokens: int            # token readbacks (K and V, every layer) summed over the steps
    worst_abs_err: float
    tolerance: float
    first_mismatch: str | None
    wall_s: float
    groups: tuple[str, ...] = ()    # the KV cache groups replayed (`ReplayGroup.describe`)

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None and self.worst_abs_err <= self.tolerance


#: The pool class (the name the tests patch): `gpu_harness.replay_pool.ReplayPool`.
_Pool = ReplayPool


def replay(trace: Trace, cfg: SimConfig, shape: ReplayShape, device: str,
           predicted_blocks: list[int] | None = None, check_every: int = 1, seed: int = 0,
           tolerance: float = 1e-4) -> ReplayReport:
    """Replay `trace` under `cfg` (paged allocator, or the hybrid one for a model with KV cache
    groups) on real pools; see the module docstring."""
    if cfg.cache.allocator != "paged":
        raise ValueError("the replay drives the paged allocator; run it with --allocator paged")
    parts = build_run(trace, cfg)
    groups = replay_groups(parts.allocator, cfg, shape)
    sched, stepper = parts.scheduler, Stepper(parts.scheduler, parts.cost, cpu_seconds=parts.profile.cpu_seconds)
    pool = _Pool(shape, groups, parts.capacity_tokens // parts.block_size, parts.block_size, device, seed)
    times, now, nxt = trace.arrival_s.tolist(), 0.0, 0
    steps = checked = tokens = copies = max_held = preemptions = verified = 0
    worst, mismatch = 0.0, None
    # async scheduling (kvsim/engine/batching/settle.py): a finished request's sequences keep their blocks
    # through the next step, freed at its end (`plan.freed`); until then they stay live here too
    held: set[int] = set()
    start = time.perf_counter()
    while True:
        while nxt < len(times) and times[nxt] <= now:
            sched.add(nxt, times[nxt])
            nxt += 1
        plan = stepper.step(now, tables=True)
        if plan is None:
            if nxt >= len(times):
                break
            now = times[nxt]
            continue
        tables = plan.group_tables
        for parent, child in plan.reforked:    # dead beams replaced by forks, before the writes
            pool.clone_shadow(parent, child)
        for r in plan.preempted:               # (a held one preempted: dropped by `_track_sequences`)
            held.difference_update(sched.seq_ids(r))
        hits = _track_sequences(pool, sched, plan)
        if plan.copies:
            pool.copy(layout.copy_mapping(plan.copies, device))
            copies += len(plan.copies)
        try:
            tokens += pool.write(layout.plan_writes(plan, sched.seq_ids, sched.computed_tokens), tables)
            for seq, cached in hits:           # after the writes: a hit may be on blocks written this step
                pool.gather_prefix(seq, tables[seq], cached)
            for parent, child in plan.forked:  # samples share the prompt just written
                pool.clone_shadow(parent, child)
            audit = pool.audit(tables, getattr(sched.alloc, "clip_chunk", None) is not None)   # (Mamba align)
            max_held, verified = max(max_held, audit.held_blocks), verified + audit.verified_slots
            if mismatch is None:
                mismatch = _memory_mismatch(steps, audit, plan.memory[0].used_blocks, predicted_blocks)
            check = steps % check_every == 0
            seqs, _, seq_lens = layout.plan_decodes(plan, sched.seq_ids, sched.computed_tokens,
                                                    plan.tables, device)
            if seqs:
                worst, checked = max(worst, pool.decode(seqs, seq_lens, tables, check)), checked + check
        except TableError as exc:              # a kernel would write or read through a null entry
            mismatch = mismatch or f"step {steps}: {exc}"
            break
        for seq in plan.freed:                 # (async: those that finished the step before)
            if seq in held:
                held.remove(seq)
                pool.drop(seq)
        for r in plan.finished:
            for seq in sched.seq_ids(r):
                if sched.settle_lag:
                    held.add(seq)
                else:
                    pool.drop(seq)
        for seq in plan.samples_ended:         # samples shorter than their request, freed
            pool.drop(seq)
        preemptions += len(plan.preempted)
        now = plan.end_s
        steps += 1
    if predicted_blocks is not None and mismatch is None and len(predicted_blocks) != steps:
        mismatch = f"kvsim predicted {len(predicted_blocks)} steps, the replay ran {steps}"
    return ReplayReport(steps, checked, tokens, copies, preemptions, max_held, verified, worst,
                        tolerance, mismatch, time.perf_counter() - start, tuple(g.describe() for g in groups))


def replay_groups(allocator, cfg: SimConfig, shape: ReplayShape) -> list[ReplayGroup]:
    """The KV cache groups the pool replays: one full group of `shape.num_layers` layers for the paged
    allocator; for the hybrid one, vLLM's groups (`kv_cache_plan`) with min(`shape.num_layers`, the
    group's layers) layers each (a Mamba group none: its state block is counted, not paged)."""
    if isinstance(allocator, PagedAllocator):
        return [ReplayGroup("full", num_layers=shape.num_layers)]
    if not isinstance(allocator, HybridAllocator):
        raise ValueError(f"{cfg.deployment.model.name}: the replay drives the paged or the hybrid allocator, "
                         f"not {type(allocator).__name__}")
    plan = kv_cache_plan(cfg.resolved())
    return [ReplayGroup(spec.kind, spec.window, spec.chunk,
                        0 if spec.kind == "mamba" else min(shape.num_layers, group.num_layers))
            for spec, group in zip(allocator.groups, plan.groups, strict=True)]


def _memory_mismatch(step: int, audit, used_blocks: int, predicted_blocks: list[int] | None) -> str | None:
    """The first disagreement between the pool's audit and kvsim at `step`, or None."""
    if audit.problem:
        return f"step {step}: {audit.problem}"
    if audit.held_blocks != used_blocks:
        return (f"step {step}: kvsim's allocator counts {used_blocks} blocks in use, the pool holds "
                f"{audit.held_blocks} for live sequences")
    if predicted_blocks is not None:
        predicted = predicted_blocks[step] if step < len(predicted_blocks) else -1
        if predicted != audit.held_blocks:
            return f"step {step}: kvsim predicted {predicted} blocks, the pool holds {audit.held_blocks}"
    return None


def _track_sequences(pool: ReplayPool, sched, plan) -> list[tuple[int, int]]:
    """Shadows for the step's memory events, before its writes: preempted sequences parked (swap) or
    dropped (recompute), swapped-in ones restored, newly admitted ones created. Returns the prefix-cache
    hits (sequence, tokens): the caller gathers them from the pool after the step's writes, since (as
    in vLLM V1, whose blocks are cached when scheduled) a request admitted in the same step as the one
    computing its prefix hits blocks that step writes."""
    hits = []
    swapped_out, swapped_in = set(plan.swapped_out), set(plan.swapped_in)
    for r in plan.preempted:
        for seq in sched.seq_ids(r):
            shadow = pool.drop(seq)
            if r in swapped_out:
                pool.parked[seq] = shadow
    for seq, cached in plan.allocated:
        r = sched.request_of(seq)
        if r in swapped_in:
            pool.shadow[seq], pool.written[seq] = pool.parked.pop(seq), 0   # rewritten this step
        else:
            pool.new_shadow(seq, sched.final_tokens(r) + 1)
            if cached:
                pool.written[seq] = cached     # its writes start after the hit; the data comes later
                hits.append((seq, cached))
    return hits
