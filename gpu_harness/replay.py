"""Replay a trace on a real KV pool, driven block for block by kvsim's own scheduler and allocator.

Each engine step: kvsim's `Scheduler` decides the batch and its paged allocator hands out blocks
(no SimPy here: the loop advances simulated time with kvsim's cost model, as the engine does); the
step's copy-on-write pairs run through `copy_blocks`, its new tokens' K/V (random) are written with
`store_kv` through slot mappings built from the block tables, and `paged_decode` runs for every
decoding sequence, layer by layer. On sampled steps every decode output is compared with a torch
reference over a contiguous shadow copy of the same sequence's K/V. At every step the number of
blocks the pool holds (distinct ids in the block tables of the live sequences, i.e. the kernels'
inputs) is compared with kvsim's prediction (`used_blocks` of the same run's steps.csv).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gpu_harness.kernels import copy_blocks, paged_decode, store_kv
from gpu_harness.layout import alloc_paged_cache, make_block_table, make_seq_lens, slots_for
from gpu_harness.reference import ref_attention
from kvsim.config import SimConfig, build_run
from kvsim.specs import ModelSpec
from kvsim.trace import Trace


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
    worst_abs_err: float
    tolerance: float
    first_mismatch: str | None
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.first_mismatch is None and self.worst_abs_err <= self.tolerance


class _RecordingAllocator:
    """Passes every call to the paged allocator and remembers what the kernels must mirror."""

    def __init__(self, alloc):
        self._alloc = alloc
        self.copies: list[tuple[int, int]] = []
        self.allocated: dict[int, int] = {}     # seq id -> tokens served by the prefix cache
        self.forks: list[tuple[int, int]] = []
        self.freed: list[int] = []

    def __getattr__(self, name):
        return getattr(self._alloc, name)

    def allocate(self, seq_id, num_tokens, final_tokens, block_hashes=(), hold_tokens=None):
        cached = self._alloc.allocate(seq_id, num_tokens, final_tokens, block_hashes, hold_tokens)
        self.allocated[seq_id] = cached
        return cached

    def append(self, seq_id, num_tokens=1):
        pairs = self._alloc.append(seq_id, num_tokens)
        self.copies.extend(pairs)
        return pairs

    def append_each(self, seq_ids, start=0, copies=None):
        return self._alloc.append_each(seq_ids, start, self.copies)

    def fork(self, parent_id, child_id):
        self._alloc.fork(parent_id, child_id)
        self.forks.append((parent_id, child_id))

    def free(self, seq_id):
        self._alloc.free(seq_id)
        self.freed.append(seq_id)

    def reset(self) -> None:
        self.copies, self.allocated, self.forks, self.freed = [], {}, [], []


class _Pool:
    """Per-layer K/V caches plus each live sequence's contiguous shadow copy (the reference's input)."""

    def __init__(self, shape: ReplayShape, num_blocks: int, block_size: int, device: str, seed: int):
        self.shape, self.bs, self.device = shape, block_size, device
        self.caches = [alloc_paged_cache(num_blocks, block_size, shape.kv_heads, shape.head_dim,
                                         shape.dtype, device, fill="zeros") for _ in range(shape.num_layers)]
        self.shadow: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # seq -> per layer (K, V)
        self.parked: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}   # freed, maybe swapped
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def random(self, *dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=self.gen).to(self.device, self.shape.dtype)

    def new_shadow(self, seq: int, length: int) -> None:
        s = self.shape
        self.shadow[seq] = [(torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device),
                             torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device))
                            for _ in range(s.num_layers)]

    def write(self, spans: list[tuple[int, list[int], int, int, bool]]) -> int:
        """Write tokens [start, end) of each (seq, table, start, end, fresh) span: fresh values are
        random, others come back from the shadow (a swap-in). Returns tokens written."""
        if not spans:
            return 0
        slots = torch.tensor([x for _, table, a, b, _ in spans for x in slots_for(table, a, b, self.bs)],
                             dtype=torch.int64, device=self.device)                     # [T]
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            keys, values = [], []
            for seq, _, a, b, fresh in spans:
                k_sh, v_sh = self.shadow[seq][layer]
                if fresh:
                    k_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                    v_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                keys.append(k_sh[a:b])
                values.append(v_sh[a:b])
            store_kv(torch.cat(keys), torch.cat(values), k_cache, v_cache, slots)   # [T, H_kv, D]
        return len(slots)

    def gather_prefix(self, seq: int, table: list[int], num_tokens: int) -> None:
        """Fill the shadow's first `num_tokens` from the pool (prefix-cache hits written earlier)."""
        slots = torch.tensor(slots_for(table, 0, num_tokens, self.bs), dtype=torch.int64, device=self.device)
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            k_sh, v_sh = self.shadow[seq][layer]
            k_sh[:num_tokens] = k_cache.flatten(0, 1)[slots]
            v_sh[:num_tokens] = v_cache.flatten(0, 1)[slots]

    def copy(self, pairs: list[tuple[int, int]]) -> None:
        mapping = torch.tensor(pairs, dtype=torch.int64, device=self.device).reshape(-1, 2)  # [P, 2]
        for k_cache, v_cache in self.caches:
            copy_blocks(k_cache, v_cache, mapping)

    def decode(self, seqs: list[int], tables: list[list[int]], lens: list[int], check: bool) -> float:
        """paged_decode for `seqs` on every layer; worst |out - reference| when `check`, else 0."""
        s, worst = self.shape, 0.0
        block_table = make_block_table(tables, self.device)     # [B, max_blocks] int32
        seq_lens = make_seq_lens(lens, self.device)             # [B] int32
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
    sched, alloc = parts.scheduler, _RecordingAllocator(parts.allocator)
    sched.alloc = alloc
    pool = _Pool(shape, alloc.num_blocks, alloc.block_size, device, seed)
    times, now, nxt = trace.arrival_s.tolist(), 0.0, 0
    steps = checked = tokens = copies = max_held = 0
    worst, mismatch = 0.0, None
    start = time.perf_counter()
    while True:
        while nxt < len(times) and times[nxt] <= now:
            sched.add(nxt, times[nxt])
            nxt += 1
        alloc.reset()
        plan = sched.schedule(now)
        if plan is None:
            if nxt >= len(times):
                break
            now = times[nxt]
            continue
        held = {b for r in sched.running for s in sched.seq_ids(r) for b in alloc.block_table(s)}
        max_held = max(max_held, len(held))
        if predicted_blocks is not None and mismatch is None:
            predicted = predicted_blocks[steps] if steps < len(predicted_blocks) else -1
            if predicted != len(held):
                mismatch = f"step {steps}: kvsim predicted {predicted} blocks, the pool holds {len(held)}"
        if alloc.copies:
            pool.copy(alloc.copies)
            copies += len(alloc.copies)
        tokens += pool.write(_spans(sched, alloc, pool, plan))
        for parent, child in alloc.forks:      # samples share the prompt just written
            pool.shadow[child] = [(k.clone(), v.clone()) for k, v in pool.shadow[parent]]
        check = steps % check_every == 0
        seqs = [s for r in plan.decodes for s in sched.seq_ids(r)]
        if seqs:
            lens = [sched.kv_len[s // sched.stride] for s in seqs]
            err = pool.decode(seqs, [alloc.block_table(s) for s in seqs], lens, check)
            worst, checked = max(worst, err), checked + check
        duration = parts.cost.step_time(plan.prefill_tokens, plan.prefill_attn_tokens,
                                        plan.decode_seqs, plan.decode_context_tokens)
        if plan.swap_tokens:
            duration += parts.cost.swap_time(plan.swap_tokens)
        now += duration
        sched.finish(plan, now)
        for seq in alloc.freed:
            pool.parked[seq] = pool.shadow.pop(seq)
        pool.parked = {s: v for s, v in pool.parked.items() if s // sched.stride in sched.swapped}
        steps += 1
    if predicted_blocks is not None and mismatch is None and len(predicted_blocks) != steps:
        mismatch = f"kvsim predicted {len(predicted_blocks)} steps, the replay ran {steps}"
    return ReplayReport(steps, checked, tokens, copies, sched.num_preemptions, max_held, worst,
                        tolerance, mismatch, time.perf_counter() - start)


def _spans(sched, alloc, pool: _Pool, plan) -> list[tuple[int, list[int], int, int, bool]]:
    """The token ranges this step writes: prefill chunks (fresh), swap-ins (restored), decode tokens."""
    spans = []
    for r, chunk in plan.prefills:
        seq = sched.seq_ids(r)[0]
        end = sched.kv_len[r] - sched.prefill_left[r]
        if seq in alloc.allocated:                       # admitted now: a new (or recomputed) sequence
            pool.new_shadow(seq, sched.prompt[r] + sched.output[r])
            if alloc.allocated[seq]:
                pool.gather_prefix(seq, alloc.block_table(seq), alloc.allocated[seq])
        spans.append((seq, alloc.block_table(seq), end - chunk, end, True))
    for r in plan.decodes:
        kv = sched.kv_len[r]
        for seq in sched.seq_ids(r):
            table = alloc.block_table(seq)
            if seq in alloc.allocated:                   # swapped back in: restore its KV
                pool.shadow[seq] = pool.parked.pop(seq)
                spans.append((seq, table, 0, kv - 1, False))
            spans.append((seq, table, kv - 1, kv, True))
    return spans
