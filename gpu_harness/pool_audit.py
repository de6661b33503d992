"""The replay's memory check from the pool's side: what the kernels wrote, read back.

kvsim's prediction (`used_blocks`) comes from its allocator's counters (free list, reference counts).
This audit counts the blocks from the other end: the distinct physical blocks reachable from the block
tables the kernels actually wrote and read through, for the sequences the harness itself knows to be
live, and it reads every token the harness wrote for those sequences back out of the pool and compares
it bit for bit with the harness's own contiguous copy. A block handed to two sequences at once shows up
twice over: the later writer's `store_kv` overwrites the earlier one's tokens (a readback mismatch
naming both sequences), and the allocator's counters no longer match the distinct blocks in the
tables. Shared blocks (forked samples, prefix-cache hits) pass: every sharer reads identical data.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class PoolAudit:
    """Blocks the pool holds for live sequences, slots verified by readback, and the first problem."""

    held_blocks: int
    verified_slots: int
    problem: str | None


def audit_pool(caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
               tables: dict[int, list[int]], written: dict[int, int],
               shadow: dict[int, list[tuple[torch.Tensor, torch.Tensor]]]) -> PoolAudit:
    """Audit the pool: `caches` per layer (K, V) [num_blocks, block_size, H_kv, D]; `tables` the block
    tables the kernels used (seq -> block ids); `written` the tokens the harness wrote for each live
    sequence (seq -> count, positions 0..count-1); `shadow` the harness's copy of them (seq -> per layer
    (K, V) [length, H_kv, D]). Live means in `written`; a table for any other sequence is a leak."""
    leaked = sorted(set(tables) - set(written))
    if leaked:
        return PoolAudit(0, 0, f"block tables for sequences the harness saw finish or leave: {leaked[:5]}")
    owners: dict[int, list[int]] = {}
    for seq in written:
        for block in tables.get(seq, ()):
            owners.setdefault(block, []).append(seq)
    verified = 0
    for seq, count in written.items():
        table = tables.get(seq, [])
        if -(-count // block_size) > len(table):
            return PoolAudit(len(owners), verified, f"sequence {seq} wrote {count} tokens but its table "
                                                    f"has {len(table)} blocks of {block_size}")
        if not count:
            continue
        pos = torch.arange(count)
        slots = torch.tensor(table, dtype=torch.int64)[pos // block_size] * block_size + pos % block_size
        for layer, (k_cache, v_cache) in enumerate(caches):
            k_sh, v_sh = shadow[seq][layer]
            idx = slots.to(k_cache.device)
            same = ((k_cache.flatten(0, 1)[idx] == k_sh[:count]).flatten(1).all(1)
                    & (v_cache.flatten(0, 1)[idx] == v_sh[:count]).flatten(1).all(1))
            if not bool(same.all()):
                p = int((~same).nonzero()[0])
                block = table[p // block_size]
                return PoolAudit(len(owners), verified,
                                 f"sequence {seq} token {p} (block {block}, layer {layer}) reads back other "
                                 f"data; block {block} is in the tables of sequences {owners[block]}")
        verified += count
    return PoolAudit(len(owners), verified, None)
