"""vLLM 0.33's hybrid KV cache manager: KV cache groups of different layer kinds (full attention and MLA,
sliding window, chunked local, Mamba) over one shared block pool, one block table per group per sequence.

`GroupSpec` names a group's kind and window; `HybridAllocator` is the coordinator, with the scheduler's
allocator interface (kvsim/alloc/base.py) plus `can_hold` (the per-step check `Scheduler._admit` asks
for when present), `group_stats` and `group_block_tables`. Plain Python; imports nothing of kvsim outside
kvsim.alloc. Modules: `groups` (one small rules class per kind), `allocator` (the pool, tables, growth),
`prefix` (prefix caching across groups), `retention` (which sliding-window blocks and Mamba states are
cached: vLLM's prefix cache retention interval), `mamba` (Mamba prefix caching: vLLM's "align" mode, with
the block-aligned chunks the scheduler asks it for), `windows` (the decode fast-forward), `ticks` (lazy decode ticks),
`accounting` (memory breakdown per group, blocks windows freed, invariants).

Supported: chunked prefill, recompute preemption, automatic prefix caching (Mamba groups in vLLM's
"align" mode) at vLLM's retention interval (default 0),
the engine's fast-forward windows. Refused with ValueError: more than one sequence per request (parallel
samples, beam search: `peak_slots`, `fork`). Not vLLM's: swap preemption (vLLM V1 has none; a swap-in
allocates a whole context at once, when `can_hold` says it fits). Lazy decode ticks (`can_tick`, the
scheduler's lazy decode steps: kvsim/engine/batching/lazy_decode.py) are exact, as the paged allocator's.
"""

from __future__ import annotations

from kvsim.alloc.hybrid.allocator import HybridAllocator
from kvsim.alloc.hybrid.groups import KINDS, NULL_BLOCK, GroupSpec

__all__ = ["KINDS", "NULL_BLOCK", "GroupSpec", "HybridAllocator"]
