"""Prefix cache for the paged allocator: chained block hashes, a hash -> block map, and an LRU set of
evictable blocks.

Units: blocks (ids into the paged pool). A block is *cached* when its chained hash is in the map; only
full blocks are ever cached. A cached block whose reference count drops to 0 becomes *evictable*: it
counts as free but keeps its contents until a fresh block is needed, least recently freed first.

Evictable blocks are kept in two queues that make one LRU order: cached ones in `_evictable`, and
*nameless* ones in `_nameless`: blocks whose hashes no lookup could ask for (`park_nameless`: the own
blocks of a sequence that is done for good). Each cached one keeps the count of nameless blocks parked
before it, so the two queues' heads can be ordered. A nameless block is a plain deque entry: most
evictable blocks are nameless where prompts share nothing, and taking one then costs what taking a
released plain free block does.

Invariants (checked by `check`):
- `b` is `_blocks_of[h]`, or in it when several blocks hold `h`, if and only if `_hash_of[b] == h`
  (each cached block holds one hash; `_blocks_of[h]` is a dict only for two blocks or more);
- every evictable block has reference count 0; it is cached, or nameless (held no hash);
- a cached block with reference count 0 is evictable (nothing cached is lost from both sets);
- the nameless counts in `_evictable` do not decrease, oldest first; `num_evictable` counts both queues.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from typing import Iterable, Sequence

_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """SplitMix64 finaliser: a deterministic 64-bit avalanche (Python's `hash()` is salted for str)."""
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9 & _MASK64
    x = (x ^ (x >> 27)) * 0x94D049BB133111EB & _MASK64
    return x ^ (x >> 31)


def unique_hashes(salt: int, start: int, stop: int) -> list[int]:
    """Hashes of blocks `start..stop-1` of a sequence whose contents no other sequence shares (a prompt
    past its shareable prefix, generated tokens): -1 - (salt * 2**32 + block index), in their own domain
    (negative; chained hashes of content ids are 64-bit non-negative), so they never equal one, and two
    differ unless salt and index both match (block indexes stay below 2**32). A plain count, not a mix:
    the cache only compares them, and they are made for every full block of every sequence."""
    base = -1 - (salt << 32)
    return list(range(base - start, base - stop, -1))


def unique_hash(salt: int, index: int) -> int:
    """`unique_hashes(salt, index, index + 1)[0]`, without the list."""
    return -1 - (salt << 32) - index


def chain_hashes(block_ids: Iterable[int]) -> list[int]:
    """Chained 64-bit hashes h_k = mix(h_{k-1}, id_k) of per-block content ids (h_{-1} = 0), so
    equal chained hashes mean equal prefixes up to and including that block."""
    hashes = []
    h = 0
    for block_id in block_ids:
        h = _mix64((h * 0x9E3779B97F4A7C15 + (block_id & _MASK64) + 1) & _MASK64)
        hashes.append(h)
    return hashes


class PrefixCache:
    """Maps chained hashes to the blocks holding them; keeps freed cached blocks evictable (LRU).

    Like vLLM's block pool, one hash may be held by several blocks (a block recomputed because hits
    stop one block short of the sequence's end, next to the cached original); a lookup takes the
    first cached of them, and each stays cached until it is evicted itself."""

    def __init__(self, tier=None) -> None:
        """`tier`: a `kvsim.alloc.cpu_tier.CpuTier` that keeps the hashes this cache evicts (None: none)."""
        self.tier = tier
        # chained hash -> the block holding it, or its blocks (first cached first) when several do: one
        # block is the usual case, and prefix caching registers every full block of every sequence
        self._blocks_of: dict[int, int | dict[int, None]] = {}
        self._hash_of: dict[int, int] = {}                  # cached block id -> chained hash
        # cached evictable block -> nameless blocks parked before it, oldest first
        self._evictable: OrderedDict[int, int] = OrderedDict()
        self._nameless: deque[int] = deque()                # nameless evictable blocks, oldest first
        self._nameless_in = 0                               # nameless blocks parked so far
        #: free blocks still holding reusable contents, both queues (blocks): read each step, so counted
        self.num_evictable = 0

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[int]:
        """Blocks holding the longest cached prefix of `hashes`, at most `max_blocks` of them.
        Changes nothing."""
        hits = []
        blocks_of = self._blocks_of
        for h in hashes[:max_blocks]:
            blocks = blocks_of.get(h)
            if blocks is None:
                break
            hits.append(blocks if blocks.__class__ is int else next(iter(blocks)))
        return hits

    def holds(self, h: int) -> bool:
        """Whether a cached block holds chained hash `h`. Changes nothing."""
        return h in self._blocks_of

    def is_evictable(self, block: int) -> bool:
        """Whether `block` is free but cached (a nameless block is not asked about: it holds no hash)."""
        return block in self._evictable

    def reuse(self, block: int) -> None:
        """Take an evictable `block` back into use (its reference count goes 0 -> 1 by the caller)."""
        del self._evictable[block]
        self.num_evictable -= 1

    def register(self, h: int, block: int) -> None:
        """Record that full `block` holds the prefix with chained hash `h` (a block already cached
        keeps its hash; another block with the same hash is cached beside it)."""
        if block not in self._hash_of:
            if self.tier is not None and self.tier.store_all:    # vLLM's OffloadingConnector: every
                self.tier.put(h)                                 # computed block is stored to CPU
            self._hash_of[block] = h
            held = self._blocks_of.setdefault(h, block)
            if held != block:                   # another block holds `h` (or several do)
                if held.__class__ is int:
                    self._blocks_of[h] = {held: None, block: None}
                else:
                    held[block] = None

    def park(self, block: int) -> bool:
        """Called when `block`'s reference count drops to 0: keep it evictable if it is cached
        (returns True), else the caller returns it to the plain free list (returns False)."""
        if block not in self._hash_of:
            return False
        self._evictable[block] = self._nameless_in
        self.num_evictable += 1
        return True

    def park_nameless(self, blocks: Iterable[int]) -> None:
        """Park full `blocks` (reference counts just dropped to 0) as evictable without registering
        their hashes: blocks whose hashes no lookup will ask for (a finished sequence's own blocks:
        `PagedAllocator.free_finished`). They are evicted in the LRU order as cached blocks are."""
        nameless = self._nameless
        before = len(nameless)
        nameless.extend(blocks)
        self._nameless_in += len(nameless) - before
        self.num_evictable += len(nameless) - before

    def evict_lru(self) -> int:
        """Forget the least recently freed evictable block and return its id (now a plain free block)."""
        self.num_evictable -= 1
        cached = self._evictable
        if not cached:
            return self._nameless.popleft()
        nameless = self._nameless
        if nameless and self._nameless_in - len(nameless) < next(iter(cached.values())):
            return nameless.popleft()                 # (parked before the oldest cached one)
        block, _ = cached.popitem(last=False)
        h = self._hash_of.pop(block)
        held = self._blocks_of[h]
        if held.__class__ is int:
            del self._blocks_of[h]
        else:
            del held[block]
            if len(held) == 1:
                self._blocks_of[h] = next(iter(held))
        if self.tier is not None and not self.tier.store_all:     # (store-all kept it when computed)
            self.tier.put(h)
        return block

    def evict_many(self, num: int) -> list[int]:
        """`num` calls of `evict_lru`, in order (nameless blocks only, while no cached one is evictable)."""
        if not self._evictable:
            self.num_evictable -= num
            popleft = self._nameless.popleft
            return [popleft() for _ in range(num)]
        return [self.evict_lru() for _ in range(num)]

    def evictable_blocks(self) -> list[int]:
        """Evictable blocks, next to be evicted first."""
        order, nameless = [], list(self._nameless)
        first, k = self._nameless_in - len(nameless), 0   # (nameless[k] was the (first + k)-th parked)
        for block, before in self._evictable.items():
            while k < len(nameless) and first + k < before:
                order.append(nameless[k])              # parked before this cached block
                k += 1
            order.append(block)
        return order + nameless[k:]

    def cached_hash(self, block: int) -> int | None:
        """The chained hash `block` holds, or None when it is not cached."""
        return self._hash_of.get(block)

    def check(self, ref_counts: Sequence[int]) -> None:
        """Assert the invariants in the module docstring."""
        holders = 0
        for h, blocks in self._blocks_of.items():
            members = (blocks,) if blocks.__class__ is int else blocks
            assert members, f"hash {h:#x} maps to no block"
            assert len(members) > 1 or members is not blocks, f"hash {h:#x} maps to one block in a dict"
            for block in members:
                assert self._hash_of.get(block) == h, f"hash map points {h:#x} at block {block}, which holds another"
            holders += len(members)
        assert len(self._hash_of) == holders, "block -> hash and hash -> block maps disagree"
        for block in self.evictable_blocks():
            assert ref_counts[block] == 0, f"evictable block {block} has reference count {ref_counts[block]}"
        assert self.num_evictable == len(self._evictable) + len(self._nameless), "evictable count drifted"
        before = list(self._evictable.values())
        assert before == sorted(before), "cached evictable blocks out of park order"
        for block, h in self._hash_of.items():
            if ref_counts[block] == 0:
                assert block in self._evictable, f"cached free block {block} is not evictable"
