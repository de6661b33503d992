"""Jenga (Zhang et al., SOSP 2025, arXiv 2503.18292): KV cache groups keep their natural page sizes in bytes
over one pool of large pages, each the least common multiple of those sizes and split into small pages of
one group; small pages are placed request-aware so a finished request frees whole large pages.

`JengaGroup` is a KV cache group with its page bytes (`groups_from_layers` makes them from per-layer bytes);
`JengaAllocator(pool_bytes, block_size, groups, ...)`
has the scheduler's allocator interface (kvsim/alloc/base.py) and the hybrid package's per-kind rules.
Plain Python; imports nothing of kvsim outside kvsim.alloc. Prefix caching across groups with Jenga's
prefix-subset evictor (whole idle large pages first): `cache` (kvsim/alloc/jenga/cache.py).
"""

from __future__ import annotations

from kvsim.alloc.jenga.allocator import JengaAllocator
from kvsim.alloc.jenga.spec import JengaGroup, PoolLayout, groups_from_layers, plan_pool

__all__ = ["JengaAllocator", "JengaGroup", "PoolLayout", "groups_from_layers", "plan_pool"]
