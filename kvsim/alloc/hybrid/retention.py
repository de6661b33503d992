"""vLLM 0.33's prefix-cache retention for sliding-window groups: which of a sequence's full blocks are
cached (`--prefix-cache-retention-interval`, `CacheConfig.prefix_cache_retention_interval`, default 0).

A sliding-window hit at a token boundary needs only the cdiv(W - 1, block_size) blocks that end there
(`SlidingRules.find_hit`), so vLLM caches a sliding group's block only where some later hit can end on it
(`SlidingWindowManager.reachable_block_mask` in `vllm/v1/core/single_type_kv_cache_manager.py`, called
by `cache_blocks` with the coordinator's `replay_boundaries` and the request's `shared_prefix_boundary`):
- `None`: dense, every full block (what kvsim did before; vLLM's behaviour with the interval unset);
- `0` (vLLM's default): only semantic checkpoints, the `need` blocks ending at the latest replay boundary
  (prompt - 1 tokens, floored to a block: a resend of the same prompt or a longer sibling resumes there)
  and at a shared-prefix junction (where the full-attention hit of the sequence's own admission ended
  beyond what the sliding group could serve: `HybridPrefix._find_hits`'s `junction`);
- a positive multiple R of the block size: those, plus the last `need` blocks of every R-token segment
  (every block if `need` >= R / block_size).
Full-attention and chunked-local groups cache densely whatever the interval. A Mamba group (vLLM's "align"
mode: kvsim/alloc/hybrid/groups.py `MambaAlignRules`) keeps state snapshots the same way
(`MambaManager.reachable_block_mask`, `mamba_mask`): a hit needs only the one block ending at a boundary,
so `0` keeps the blocks ending at the block-floored replay boundary and junction, a positive R also the
last block of every R-token segment (every block if R <= block_size), `None` every block; only blocks that
hold a state at all (a prefill chunk's end, or a decode step's) can be cached. Without EAGLE and with one block size for all groups
(kvsim's hybrid allocator), vLLM's alignment is the block size; this module assumes both.
"""

from __future__ import annotations

from typing import Sequence

#: vLLM 0.33's default (`vllm/config/cache.py`: `prefix_cache_retention_interval = Field(default=0)`).
DEFAULT_RETENTION = 0


def check_retention(interval: int | None, block_size: int, kinds: Sequence[str]) -> None:
    """ValueError where vLLM's `_validate_prefix_cache_retention_interval` (kv_cache_coordinator.py)
    refuses `interval` for groups of `kinds` (it checks at start-up, prefix caching on or off)."""
    if interval is None:
        return
    if not any(k in ("sliding", "mamba") for k in kinds):
        if interval == 0:
            return
        raise ValueError(f"prefix cache retention interval {interval} is set but this model has no "
                         f"sliding-window or Mamba KV cache group, so retention has no effect: set it to 0 "
                         f"(vLLM refuses it)")
    if interval < 0 or interval % block_size:
        raise ValueError(f"prefix cache retention interval ({interval}) must be non-negative and a multiple "
                         f"of the block size ({block_size}), or none")


def reachable_mask(start: int, end: int, block_size: int, window: int, interval: int | None,
                   boundaries: Sequence[int]) -> list[bool] | None:
    """Per block index in [start, end): whether a sliding group of `window` tokens caches it (None: every
    block), for a sequence whose reachable token boundaries are `boundaries` (the replay boundary, then
    the junction if any). vLLM's `SlidingWindowManager.reachable_block_mask` with alignment = block size,
    no EAGLE."""
    need = -(-(window - 1) // block_size)        # blocks a hit ending at a boundary reads
    mask = [False] * (end - start)
    segment = block_size if interval is None else (interval or None)
    if segment is not None:
        per_segment = segment // block_size
        if need >= per_segment:
            return None
        for i in range(start, end):
            if i % per_segment >= per_segment - need:
                mask[i - start] = True
    if interval is not None:
        for boundary in boundaries:
            last = boundary // block_size           # (the block-floored boundary, in blocks)
            for j in range(max(start, last - need), min(end, last)):
                mask[j - start] = True
    return mask


def mamba_mask(start: int, end: int, block_size: int, interval: int | None,
               boundaries: Sequence[int]) -> list[bool] | None:
    """Per block index in [start, end): whether a Mamba group caches its state block (None: every block);
    vLLM's `MambaManager.reachable_block_mask` with alignment = block size."""
    if interval is None:
        return None
    mask = [False] * (end - start)
    if interval:
        per_segment = interval // block_size
        if per_segment <= 1:
            return None
        first = (start + per_segment) // per_segment * per_segment - 1
        for i in range(first - start, len(mask), per_segment):
            mask[i] = True
    for boundary in boundaries:
        block = boundary // block_size - 1
        if start <= block < end:
            mask[block - start] = True
    return mask
