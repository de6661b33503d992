"""A CPU tier under the GPU prefix cache: the chained hashes of blocks the GPU prefix cache evicted,
kept in CPU memory, least recently used dropped first, as vLLM's KV offloading
(`--kv-offloading-size`, vllm/v1/kv_offload/: an LRU of CPU blocks) and LMCache's local CPU backend keep
them. A later request whose prompt continues past its GPU hits into blocks held here gets them without
computing them: each takes a fresh GPU block and is loaded over PCIe (the scheduler adds the load to the
step's PCIe traffic, timed by the cost model's `swap_time`).

Units: blocks of the GPU pool's block size. Two policies (`store_all`, `--cpu-kv-policy`):
- "evicted" (default): a block is stored when the GPU evicts it (a victim cache); a block loaded back
  stays here too (most recently used);
- "store-all": vLLM's OffloadingConnector (`--kv-offloading-size`, vllm/v1/kv_offload/): every full block
  is stored as soon as it is computed (the GPU-to-CPU copy runs on its own stream, overlapped with the
  steps: its bytes are counted, `stored`, not timed), and an eviction stores nothing. A CPU tier smaller
  than the GPU cache then holds mostly copies of blocks the GPU still has.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Sequence


class CpuTier:
    """At most `capacity_blocks` hashes in LRU order; counts what it stored, dropped and loaded."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 0:
            raise ValueError(f"the CPU tier holds >= 0 blocks, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self.store_all = False  # vLLM's OffloadingConnector: store every computed block (the prefix cache asks)
        self._lru: OrderedDict[int, None] = OrderedDict()     # oldest first
        self.stored = 0         # blocks put here (evicted from the GPU)
        self.dropped = 0        # blocks forgotten for want of room
        self.loaded = 0         # blocks loaded back to the GPU
        self._pending = 0       # tokens loaded since the scheduler last asked (`take_loaded_tokens`)

    def __len__(self) -> int:
        return len(self._lru)

    def put(self, h: int) -> None:
        """Keep the block with chained hash `h` (the GPU just evicted it), dropping the LRU one if full."""
        if not self.capacity_blocks:
            return
        lru = self._lru
        if h in lru:
            lru.move_to_end(h)
            return
        lru[h] = None
        self.stored += 1
        if len(lru) > self.capacity_blocks:
            lru.popitem(last=False)
            self.dropped += 1

    def count(self, hashes: Sequence[int], start: int, stop: int) -> int:
        """How many of `hashes[start:stop]` from `start` on are held here, without a gap. Changes nothing."""
        lru, n = self._lru, 0
        for h in hashes[start:stop]:
            if h not in lru:
                break
            n += 1
        return n

    def load(self, hashes: Sequence[int], start: int, num: int, block_size: int) -> None:
        """`hashes[start:start + num]` (held here) are loaded to the GPU: most recently used now."""
        lru = self._lru
        for h in hashes[start:start + num]:
            lru.move_to_end(h)
        self.loaded += num
        self._pending += num * block_size

    def take_loaded_tokens(self) -> int:
        """Tokens loaded since the last call (the scheduler adds them to the step's PCIe traffic)."""
        tokens, self._pending = self._pending, 0
        return tokens
