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
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gpu_harness import layout
from gpu_harness.kernels import copy_blocks, paged_decode, store_kv
from gpu_harness.pool_audit import audit_pool
from gpu_harness.reference import ref_attention
from kvsim.engine.config import SimConfig
from kvsim.alloc.paged import PagedAllocator
from kvsim.engine.build import build_run
from kvsim.specs import ModelSpec
from kvsim.engine.step import Stepper
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

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None and self.worst_abs_err <= self.tolerance


class _Pool:
    """Per-layer K/V caches plus each live sequence's contiguous shadow copy (the reference's input)."""

    def __init__(self, shape: ReplayShape, num_blocks: int, block_size: int, device: str, seed: int):
        self.shape, self.bs, self.device = shape, block_size, device
        self.caches = [layout.alloc_paged_cache(num_blocks, block_size, shape.kv_heads, shape.head_dim,
                                         shape.dtype, device, fill="zeros") for _ in range(shape.num_layers)]
        self.shadow: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # seq -> per layer (K, V)
        self.parked: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # freed, maybe swapped
        self.written: dict[int, int] = {}      # live seq -> tokens 0..n-1 written to the pool for it
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def random(self, *dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=self.gen).to(self.device, self.shape.dtype)

    def new_shadow(self, seq: int, length: int) -> None:
        s = self.shape
        self.shadow[seq] = [(torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device),
                             torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device))
                            for _ in range(s.num_layers)]
        self.written[seq] = 0

    def drop(self, seq: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Forget live sequence `seq` (finished or preempted); returns its shadow."""
        del self.written[seq]
        return self.shadow.pop(seq)

    def write(self, writes: list[tuple[int, int, int, bool]], slots: torch.Tensor) -> int:
        """Write tokens [start, end) of each (seq, start, end, fresh) range at `slots` [T]: fresh values
        are random, others come back from the shadow (a swap-in). Returns tokens written."""
        if not writes:
            return 0
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            keys, values = [], []
            for seq, a, b, fresh in writes:
                k_sh, v_sh = self.shadow[seq][layer]
                if fresh:
                    k_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                    v_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                keys.append(k_sh[a:b])
                values.append(v_sh[a:b])
                self.written[seq] = max(self.written[seq], b)
            store_kv(torch.cat(keys), torch.cat(values), k_cache, v_cache, slots)   # [T, H_kv, D]
        return len(slots)

    def gather_prefix(self, seq: int, table: list[int], num_tokens: int) -> None:
        """Fill the shadow's first `num_tokens` from the pool (prefix-cache hits written earlier)."""
        slots = layout.make_slot_mapping([(table, 0, num_tokens)], self.bs, self.device)
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            k_sh, v_sh = self.shadow[seq][layer]
            k_sh[:num_tokens] = k_cache.flatten(0, 1)[slots]
            v_sh[:num_tokens] = v_cache.flatten(0, 1)[slots]
        self.written[seq] = num_tokens

    def copy(self, mapping: torch.Tensor) -> None:
        """Copy-on-write: `copy_blocks` with a [P, 2] (src, dst) mapping on every layer."""
        for k_cache, v_cache in self.caches:
            copy_blocks(k_cache, v_cache, mapping)

    def decode(self, seqs: list[int], block_table: torch.Tensor, seq_lens: torch.Tensor, check: bool) -> float:
        """paged_decode for `seqs` ([B, max_blocks] table, [B] lengths) on every layer; worst
        |out - reference| when `check`, else 0."""
        s, worst = self.shape, 0.0
        lens = seq_lens.tolist()
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            q = self.random(len(seqs), s.q_heads, s.head_dim)  # [B, Hq, D]
            out = paged_decode(q, k_cache, v_cache, block_table, seq_lens, max_seq_len=max(lens))
            if check:
                for b, (seq, n) in enumerate(zip(seqs, lens)):
                    k_sh, v_sh = self.shadow[seq][layer]
                    ref = ref_attention(q[b], k_sh[:n], v_sh[:n])                  # [Hq, D] fp32
                    worst = max(worst, (out[b].float() - ref).abs().max().item())
        return worst


def replay(trace: Trace, cfg: SimConfig, shape: ReplayShape, device: str,
           predicted_blocks: list[int] | None = None, check_every: int = 1, seed: int = 0,
           tolerance: float = 1e-4) -> ReplayReport:
    """Replay `trace` under `cfg` (paged allocator) on real pools; see the module docstring."""
    if cfg.cache.allocator != "paged":
        raise ValueError("the replay drives the paged allocator; run it with --allocator paged")
    parts = build_run(trace, cfg)
    if not isinstance(parts.allocator, PagedAllocator):
        raise ValueError(f"{cfg.deployment.model.name}: the replay drives one block table per sequence; this "
                         "model's KV cache groups (sliding, chunked or Mamba layers) need one per group, which "
                         "the replay does not do yet (kernels: `kvsim harness check --grid hybrid`); "
                         "--no-hybrid-kv-cache replays it with every layer paged as full attention")
    sched, stepper = parts.scheduler, Stepper(parts.scheduler, parts.cost, cpu_seconds=parts.profile.cpu_seconds)
    pool = _Pool(shape, parts.capacity_tokens // parts.block_size, parts.block_size, device, seed)
    times, now, nxt = trace.arrival_s.tolist(), 0.0, 0
    steps = checked = tokens = copies = max_held = preemptions = verified = 0
    worst, mismatch = 0.0, None
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
        for parent, child in plan.reforked:    # dead beams replaced by forks, before the writes
            pool.shadow[child] = [(k.clone(), v.clone()) for k, v in pool.shadow[parent]]
            pool.written[child] = pool.written[parent]
        _track_sequences(pool, sched, plan)
        if plan.copies:
            pool.copy(layout.copy_mapping(plan.copies, device))
            copies += len(plan.copies)
        writes = layout.plan_writes(plan, sched.seq_ids, sched.computed_tokens)
        tokens += pool.write(writes, layout.writes_slot_mapping(writes, plan.tables, pool.bs, device))
        for parent, child in plan.forked:      # samples share the prompt just written
            pool.shadow[child] = [(k.clone(), v.clone()) for k, v in pool.shadow[parent]]
            pool.written[child] = pool.written[parent]
        audit = audit_pool(pool.caches, pool.bs, plan.tables, pool.written, pool.shadow)
        max_held, verified = max(max_held, audit.held_blocks), verified + audit.verified_slots
        if mismatch is None:
            mismatch = _memory_mismatch(steps, audit, plan.memory[0].used_blocks, predicted_blocks)
        check = steps % check_every == 0
        seqs, block_table, seq_lens = layout.plan_decodes(plan, sched.seq_ids, sched.computed_tokens,
                                                          plan.tables, device)
        if seqs:
            worst, checked = max(worst, pool.decode(seqs, block_table, seq_lens, check)), checked + check
        for r in plan.finished:
            for seq in sched.seq_ids(r):
                pool.drop(seq)
        for seq in plan.samples_ended:         # samples shorter than their request, freed
            pool.drop(seq)
        preemptions += len(plan.preempted)
        now = plan.end_s
        steps += 1
    if predicted_blocks is not None and mismatch is None and len(predicted_blocks) != steps:
        mismatch = f"kvsim predicted {len(predicted_blocks)} steps, the replay ran {steps}"
    return ReplayReport(steps, checked, tokens, copies, preemptions, max_held, verified, worst,
                        tolerance, mismatch, time.perf_counter() - start)


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


def _track_sequences(pool: _Pool, sched, plan) -> None:
    """Shadows for the step's memory events, before its writes: preempted sequences parked (swap) or
    dropped (recompute), swapped-in ones restored, newly admitted ones created (prefix-cache hits
    gathered from the pool, where an earlier request wrote them)."""
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
                pool.gather_prefix(seq, plan.tables[seq], cached)
