"""The replay's real KV pool (`ReplayPool`): per-layer K/V caches shared by every KV cache group, each
live sequence's contiguous shadow copy (the reference's input), and the step's writes, copies and
decodes through kvsim's block tables (`gpu_harness.replay` drives it).

As in vLLM's hybrid KV cache manager (`vllm/v1/worker/utils.py` and `KVCacheConfig.kv_cache_tensors`:
one tensor shared by the j-th layer of every group), layer j of every group pages into `caches[j]`, so a
block id names one page per layer in whichever group holds it. A plain paged model is one full group.
The pool keeps one page more than the allocator's blocks, before block 0: a null entry (-1, a block a
window skipped) points there, as vLLM's entries point to its null block 0, so a kernel that read one
would read that (zero) page, never memory outside the pool. Writes never go through a null entry: a new
token whose entry is null raises `TableError`; tokens restored by a swap-in skip the null head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_harness import layout
from gpu_harness.kernels import copy_blocks, paged_decode, store_kv
from gpu_harness.pool_audit import PoolAudit, audit_groups
from gpu_harness.reference import ref_attention


class TableError(ValueError):
    """A block table that would make a kernel write or read through a null entry."""


@dataclass(frozen=True, slots=True)
class ReplayGroup:
    """A KV cache group as replayed: `kind` (full, sliding, chunked, mamba), `window` or `chunk`
    (tokens; 0 when not that kind) and `num_layers` replayed (a Mamba group's: 0, nothing paged)."""

    kind: str
    window: int = 0
    chunk: int = 0
    num_layers: int = 1

    def describe(self) -> str:
        """E.g. "sliding (W=128): 2 layers", "mamba: counted, not paged"."""
        span = f" (W={self.window})" if self.window else f" (chunk {self.chunk})" if self.chunk else ""
        return f"{self.kind}{span}: " + (f"{self.num_layers} layer(s)" if self.num_layers else "counted, not paged")

    def start(self, seq_len: int) -> int:
        """First token position a decode with context `seq_len` reads in this group."""
        if self.kind == "sliding":
            return layout.window_start(seq_len, self.window)
        return layout.chunk_start(seq_len, self.chunk) if self.kind == "chunked" else 0


class ReplayPool:
    """K/V caches (one per layer index, shared by the groups), shadows and written-token counts."""

    def __init__(self, shape, groups: list[ReplayGroup], num_blocks: int, block_size: int, device: str,
                 seed: int):
        self.shape, self.groups, self.bs, self.device = shape, groups, block_size, device
        layers = max(g.num_layers for g in groups)
        full = [layout.alloc_paged_cache(num_blocks + 1, block_size, shape.kv_heads, shape.head_dim,
                                         shape.dtype, device, fill="zeros") for _ in range(layers)]
        self.caches = [(k[1:], v[1:]) for k, v in full]      # block -1 is the page before block 0
        self.shadow: dict[int, list[list[tuple[torch.Tensor, torch.Tensor]]]] = {}  # seq -> group -> layer
        self.parked: dict[int, list[list[tuple[torch.Tensor, torch.Tensor]]]] = {}  # freed, maybe swapped
        self.written: dict[int, int] = {}      # live seq -> tokens 0..n-1 written to the pool for it
        self.gen = torch.Generator(device="cpu").manual_seed(seed)

    def random(self, *dims: int) -> torch.Tensor:
        return torch.randn(*dims, generator=self.gen).to(self.device, self.shape.dtype)

    def new_shadow(self, seq: int, length: int) -> None:
        s = self.shape
        self.shadow[seq] = [[(torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device),
                              torch.zeros(length, s.kv_heads, s.head_dim, dtype=s.dtype, device=self.device))
                             for _ in range(g.num_layers)] for g in self.groups]
        self.written[seq] = 0

    def clone_shadow(self, parent: int, child: int) -> None:
        """`child` (a fork) starts with a copy of `parent`'s shadow and written tokens."""
        self.shadow[child] = [[(k.clone(), v.clone()) for k, v in layers] for layers in self.shadow[parent]]
        self.written[child] = self.written[parent]

    def drop(self, seq: int) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
        """Forget live sequence `seq` (finished or preempted); returns its shadow."""
        del self.written[seq]
        return self.shadow.pop(seq)

    def write(self, writes: list[tuple[int, int, int, bool]], tables: dict[int, list[list[int]]]) -> int:
        """Write tokens [start, end) of each (seq, start, end, fresh) range through each group's table
        (`tables`: seq -> one table per group): fresh values are random, others come back from the
        shadow (a swap-in; positions under a null entry are skipped). Returns tokens written."""
        if not writes:
            return 0
        spans = [self._spans(writes, tables, g) for g in range(len(self.groups))]
        slots = [layout.make_slot_mapping([(tables[seq][g], a, b) for seq, a, b, _ in spans[g]], self.bs,
                                          self.device) if spans[g] else None for g in range(len(self.groups))]
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            for g, group in enumerate(self.groups):
                if layer >= group.num_layers or slots[g] is None:
                    continue
                keys, values = [], []
                for seq, a, b, fresh in spans[g]:
                    k_sh, v_sh = self.shadow[seq][g][layer]
                    if fresh:
                        k_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                        v_sh[a:b] = self.random(b - a, self.shape.kv_heads, self.shape.head_dim)
                    keys.append(k_sh[a:b])
                    values.append(v_sh[a:b])
                store_kv(torch.cat(keys), torch.cat(values), k_cache, v_cache, slots[g])   # [T, H_kv, D]
        for seq, _, b, _ in writes:
            self.written[seq] = max(self.written[seq], b)
        return sum(b - a for _, a, b, _ in writes)

    def _spans(self, writes, tables, g: int) -> list[tuple[int, int, int, bool]]:
        """Group `g`'s share of `writes`: restored ranges start after the table's null head; a fresh
        token under a null entry raises TableError."""
        if self.groups[g].num_layers == 0:
            return []
        out = []
        for seq, a, b, fresh in writes:
            table = tables[seq][g]
            head = next((j for j, block in enumerate(table) if block >= 0), len(table)) * self.bs
            if fresh and a < head:
                raise TableError(f"sequence {seq} writes token {a} through a null entry (block {a // self.bs}) "
                                 f"of group {g} ({self.groups[g].kind})")
            if max(a, head) < b:
                out.append((seq, max(a, head), b, fresh))
        return out

    def gather_prefix(self, seq: int, tables: list[list[int]], num_tokens: int) -> None:
        """Fill the shadow's first `num_tokens` from the pool (prefix-cache hits written earlier), in
        each group from its first non-null entry."""
        for g, table in enumerate(tables):
            start = next((j for j, block in enumerate(table) if block >= 0), len(table)) * self.bs
            if start >= num_tokens or not self.groups[g].num_layers:
                continue
            slots = layout.make_slot_mapping([(table, start, num_tokens)], self.bs, self.device)
            for layer, (k_sh, v_sh) in enumerate(self.shadow[seq][g]):
                k_cache, v_cache = self.caches[layer]
                k_sh[start:num_tokens] = k_cache.flatten(0, 1)[slots]
                v_sh[start:num_tokens] = v_cache.flatten(0, 1)[slots]
        self.written[seq] = max(self.written.get(seq, 0), num_tokens)   # (gathered after the step's writes)

    def copy(self, mapping: torch.Tensor) -> None:
        """Copy-on-write: `copy_blocks` with a [P, 2] (src, dst) mapping on every layer."""
        for k_cache, v_cache in self.caches:
            copy_blocks(k_cache, v_cache, mapping)

    def decode(self, seqs: list[int], seq_lens: torch.Tensor, tables: dict[int, list[list[int]]],
               check: bool) -> float:
        """paged_decode for `seqs` ([B] context lengths) on every layer of every attention group, each
        through its group's tables with its window or chunk; worst |out - reference| (the reference over
        the same window) when `check`, else 0. A table that nulls a block the window reads: TableError."""
        s, worst, lens = self.shape, 0.0, seq_lens.tolist()
        rows = [[tables[seq][g] for seq in seqs] for g in range(len(self.groups))]
        for g, group in enumerate(self.groups):
            if group.kind in ("sliding", "chunked") and group.num_layers:
                try:
                    layout.check_window_tables(rows[g], lens, self.bs, group.window or group.chunk,
                                               chunked=group.kind == "chunked")
                except ValueError as exc:
                    raise TableError(f"group {g} ({group.kind}): {exc}") from None
        block_tables = layout.group_block_tables(list(zip(*rows)), self.device)
        for layer, (k_cache, v_cache) in enumerate(self.caches):
            for g, group in enumerate(self.groups):
                if layer >= group.num_layers:
                    continue
                q = self.random(len(seqs), s.q_heads, s.head_dim)  # [B, Hq, D]
                out = paged_decode(q, k_cache, v_cache, block_tables[g], seq_lens, max_seq_len=max(lens),
                                   window=group.window or None, chunk=group.chunk or None)
                if check:
                    for b, (seq, n) in enumerate(zip(seqs, lens)):
                        k_sh, v_sh = self.shadow[seq][g][layer]
                        a = group.start(n)
                        ref = ref_attention(q[b], k_sh[a:n], v_sh[a:n])               # [Hq, D] fp32
                        worst = max(worst, (out[b].float() - ref).abs().max().item())
        return worst

    def audit(self, tables: dict[int, list[list[int]]], shared_states: bool = False) -> PoolAudit:
        """`gpu_harness.pool_audit.audit_groups` of the pool after the step's writes (`shared_states`:
        Mamba states shared through the prefix cache)."""
        return audit_groups(self.caches, self.bs, tables, self.written, self.shadow,
                            [g.kind for g in self.groups], shared_states)
