"""KV-cache allocators: paged (blocks, sharing, prefix caching), contiguous (one extent per sequence),
hybrid (vLLM's hybrid KV cache manager: per-group block tables over one pool, kvsim/alloc/hybrid/) and
jenga (Jenga's LCM two-level pages, each group at its own page size in bytes, kvsim/alloc/jenga/).

`make_allocator` builds one from the run's settings; capacities are in token slots. Plain Python that
imports nothing else of kvsim: only the engine's scheduler calls an allocator (and `engine.build` makes
one), as vLLM's block manager is the scheduler's alone.
"""

from __future__ import annotations

from kvsim.alloc.base import AllocationError, Allocator, MemoryStats
from kvsim.alloc.contiguous.allocator import PLACEMENTS, RESERVE_POLICIES, ContiguousAllocator
from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.alloc.paged.prefix import chain_hashes

ALLOCATORS = ("paged", "contiguous")   # what a run's `CacheConfig.allocator` may name

__all__ = ["ALLOCATORS", "PLACEMENTS", "RESERVE_POLICIES", "AllocationError", "Allocator",
           "ContiguousAllocator", "MemoryStats", "PagedAllocator", "chain_hashes", "make_allocator"]


def make_allocator(kind: str, capacity_tokens: int, block_size: int = 16, max_seq_len: int = 2048,
                   reserve: str = "max", placement: str = "buddy", prefix_caching: bool = False,
                   groups=None, max_in_flight_tokens: int = 0, prefill_chunk_tokens: int | None = None,
                   pool_bytes: int = 0, cpu_tier_blocks: int = 0, retention_interval: int | None = 0,
                   mamba_checkpoints: bool = False):
    """An allocator over `capacity_tokens` slots: "paged" gets capacity_tokens // block_size blocks
    (the remainder is unused), "contiguous" uses `max_seq_len`, `reserve` and `placement`; "hybrid"
    (`kvsim.alloc.hybrid.HybridAllocator`) gets capacity_tokens // block_size blocks shared by `groups`
    (GroupSpecs), `max_seq_len` as vLLM's max_model_len, `max_in_flight_tokens` and `prefill_chunk_tokens`;
    "jenga" (`kvsim.alloc.jenga.JengaAllocator`) sizes itself from `pool_bytes` (KV bytes per GPU) and its
    `groups` (JengaGroups, each with its page bytes), ignoring `capacity_tokens`, else as "hybrid".
    `cpu_tier_blocks`: paged with prefix caching only, a CPU tier of that many blocks (`cpu_tier`).
    `retention_interval`: "hybrid" only, vLLM's prefix cache retention interval (`hybrid.retention`);
    `mamba_checkpoints`: "hybrid" only, Mamba layers that export prefill checkpoints (`hybrid.mamba`)."""
    if kind == "jenga":
        from kvsim.alloc.jenga import JengaAllocator
        if not groups or pool_bytes < 1:
            raise ValueError("the jenga allocator needs pool_bytes >= 1 and its groups (groups=[JengaGroup, ...])")
        return JengaAllocator(pool_bytes, block_size, groups, max_seq_len, max_in_flight_tokens,
                              prefill_chunk_tokens, prefix_caching)
    if kind == "hybrid":
        from kvsim.alloc.hybrid import HybridAllocator
        if not groups:
            raise ValueError("the hybrid allocator needs its KV cache groups (groups=[GroupSpec, ...])")
        return HybridAllocator(capacity_tokens // block_size, block_size, groups, max_seq_len,
                               max_in_flight_tokens, prefill_chunk_tokens, prefix_caching, retention_interval,
                               mamba_checkpoints)
    if kind == "paged":
        return PagedAllocator(capacity_tokens // block_size, block_size, prefix_caching=prefix_caching,
                              cpu_tier_blocks=cpu_tier_blocks)
    if kind == "contiguous":
        return ContiguousAllocator(capacity_tokens, max_seq_len, reserve=reserve, placement=placement)
    raise ValueError(f"unknown allocator {kind!r}; known: {', '.join(ALLOCATORS)}, hybrid, jenga")
