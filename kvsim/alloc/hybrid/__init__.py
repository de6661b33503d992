"""vLLM 0.33's hybrid KV cache manager: KV cache groups of different layer kinds (full attention and MLA,
sliding window, chunked local, Mamba) over one shared block pool, one block table per group per sequence.

`GroupSpec` names a group's kind and window; `HybridAllocator` is the coordinator, with the scheduler's
allocator interface (kvsim/alloc/base.py). Plain Python; imports nothing of kvsim outside kvsim.alloc.
"""

from __future__ import annotations

from .allocator import HybridAllocator
from .groups import KINDS, NULL_BLOCK, GroupSpec

__all__ = ["KINDS", "NULL_BLOCK", "GroupSpec", "HybridAllocator"]
