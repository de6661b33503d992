"""Attention cost per layer kind for models whose layers are not all full attention (issue 23 item 5).

The roofline (`kvsim.cost.roofline`) prices full attention from two sums a step plan carries: query-key
pairs of the prefill chunks and KV tokens the decodes read. Other kinds read less:
- `sliding` (window W): a query at position p attends its last min(p, W) tokens (itself included:
  vLLM runs sliding layers with FlashAttention's window_size = (W - 1, 0));
- `chunked` (chunk C, Llama 4's local layers): a query at position p (0-based) attends the tokens of its
  own chunk so far, p mod C + 1;
- `full` and `mla` read every context token (MLA reads its latent, which `LayerGroup.page_bytes_per_token`
  already sizes); `mamba` layers read and write one fixed state per sequence per step (no per-token term).
So a step's sliding and chunked layers cost what their *capped* context costs, which depends on each
sequence's own context, not on the sum. `CappedAttention` holds the capped groups and prices them from
per-sequence contexts; the roofline keeps the full-context groups. Prefill pairs of a chunk of `q` tokens
ending at context `c` are counted as q x min(c, cap) for a capped group (before the causal halving the
roofline applies to every chunk), as full attention's q x c. Seconds; tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True, slots=True)
class CappedGroup:
    """Layers whose reads are capped: `kind` "sliding" (window `size`) or "chunked" (chunk `size`), with
    `decode_s_per_token` (seconds per KV token read in all of its layers) and `prefill_s_per_pair`
    (seconds per query-key pair in all of its layers, causal halving included)."""

    kind: str
    size: int
    decode_s_per_token: float
    prefill_s_per_pair: float

    def __post_init__(self) -> None:
        if self.kind not in ("sliding", "chunked"):
            raise ValueError(f"CappedGroup: kind must be sliding or chunked, got {self.kind!r}")
        if self.size < 1:
            raise ValueError(f"CappedGroup {self.kind}: size must be >= 1 token, got {self.size}")

    def read(self, context: int) -> int:
        """KV tokens one decode at `context` tokens (the new one included) reads in one layer."""
        if self.kind == "sliding":
            return context if context < self.size else self.size
        return (context - 1) % self.size + 1


class CappedAttention:
    """The capped (sliding, chunked) groups of one model; `time` prices one step from its sequences'
    contexts, `window_times` a run of decode steps of a steady batch."""

    def __init__(self, groups: Sequence[CappedGroup]):
        self.groups = tuple(groups)

    def __bool__(self) -> bool:
        return bool(self.groups)

    def time(self, prefills: Iterable[tuple[int, int]], decodes: Iterable[tuple[int, int]]) -> float:
        """Seconds of the capped layers' attention for prefill chunks `(chunk tokens, context after
        the chunk)` and decodes `(context with the new token, sequences)`."""
        decodes = list(decodes)
        return self.time_reads(prefills, [sum(g.read(c) * n for c, n in decodes) for g in self.groups])

    def time_reads(self, prefills: Iterable[tuple[int, int]], reads: Sequence[int]) -> float:
        """`time` from the decodes' reads per group (the sum of `read(context) x sequences`, KV tokens per
        layer): the same seconds, for callers that keep those sums (kvsim/engine/batching/capped_reads.py)."""
        prefills = list(prefills)
        total = 0.0
        for g, read in zip(self.groups, reads):
            if prefills:
                total += g.prefill_s_per_pair * sum(q * min(c, g.size) for q, c in prefills)
            if read:
                total += g.decode_s_per_token * read
        return total

    def window_times(self, decodes: Sequence[tuple[int, int]], steps: int) -> np.ndarray:
        """Seconds of the capped layers in each of `steps` decode steps of the sequences `decodes`
        (context with the new token at the first step, sequences), each step one token longer."""
        out = np.zeros(steps)
        if not decodes or steps <= 0:
            return out
        ctx = np.array([c for c, _ in decodes], dtype=np.int64)
        seqs = np.array([n for _, n in decodes], dtype=np.float64)
        grown = ctx[None, :] + np.arange(steps, dtype=np.int64)[:, None]      # [step, sequence]
        for g in self.groups:
            reads = np.minimum(grown, g.size) if g.kind == "sliding" else (grown - 1) % g.size + 1
            out += g.decode_s_per_token * (reads @ seqs)
        return out
