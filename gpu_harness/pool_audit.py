"""The replay's memory check from the pool's side: what the kernels wrote, read back.

kvsim's prediction (`used_blocks`) comes from its allocator's counters (free list, reference counts).
This audit counts the blocks from the other end: the distinct physical blocks reachable from the block
tables the kernels actually wrote and read through, for the sequences the harness itself knows to be
live, and it reads every token the harness wrote for those sequences back out of the pool and compares
it bit for bit with the harness's own contiguous copy. A block handed to two sequences at once shows up
twice over: the later writer's `store_kv` overwrites the earlier one's tokens (a readback mismatch
naming both sequences), and the allocator's counters no longer match the distinct blocks in the
tables. Shared blocks (forked samples, prefix-cache hits) pass: every sharer reads identical data.

A hybrid model (`audit_groups`) has one table per KV cache group over one pool, as in vLLM's hybrid KV
cache manager: layer j of every group pages into the same tensor, so a block id names one page per
layer in each group at once. A block may then be in the tables of one group only (entries of two groups
would overwrite each other's pages), a Mamba group's state block in one entry only (`shared_states`: Mamba
prefix caching, vLLM's align mode, where a hit shares a cached state, never written again, so several
sequences may hold one, each once; each writes its next state into a block of its own), and null entries (-1: blocks
a window skipped, or a Mamba table's entries between its states) hold no block and are never read back.
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
    return audit_groups(caches, block_size, {s: [t] for s, t in tables.items()}, written,
                        {s: [sh] for s, sh in shadow.items()}, ["full"])


def audit_groups(caches: list[tuple[torch.Tensor, torch.Tensor]], block_size: int,
                 tables: dict[int, list[list[int]]], written: dict[int, int],
                 shadow: dict[int, list[list[tuple[torch.Tensor, torch.Tensor]]]],
                 kinds: list[str], shared_states: bool = False) -> PoolAudit:
    """`audit_pool` over KV cache groups: `tables` seq -> one table per group (-1: null entry);
    `shadow` seq -> per group, per replayed layer of it (K, V) [length, H_kv, D] (layer j of a group in
    `caches[j]`); `kinds` each group's kind (a "mamba" group's state block is counted, not read)."""
    leaked = sorted(set(tables) - set(written))
    if leaked:
        return PoolAudit(0, 0, f"block tables for sequences the harness saw finish or leave: {leaked[:5]}")
    owners: dict[int, list[int]] = {}
    group_of: dict[int, int] = {}
    for seq in written:
        for g, table in enumerate(tables.get(seq, [[]] * len(kinds))):
            for block in table:
                if block < 0:
                    continue
                if group_of.setdefault(block, g) != g or (kinds[g] == "mamba" and block in owners and (
                        not shared_states or seq in owners[block])):
                    return PoolAudit(len(owners), 0, f"block {block} is held twice: by group "
                                                     f"{group_of[block]} of sequences {owners[block]} and "
                                                     f"by group {g} of sequence {seq}")
                owners.setdefault(block, []).append(seq)
    verified = 0
    for seq, count in written.items():
        for g, kind in enumerate(kinds):
            if kind == "mamba":
                continue
            table = tables.get(seq, [[]] * len(kinds))[g]
            where = "" if len(kinds) == 1 else f" in group {g}"
            if -(-count // block_size) > len(table):
                return PoolAudit(len(owners), verified, f"sequence {seq} wrote {count} tokens but its table"
                                                        f"{where} has {len(table)} blocks of {block_size}")
            if not count:
                continue
            pos = torch.arange(count)
            ids = torch.tensor(table, dtype=torch.int64)[pos // block_size]
            pos, ids = pos[ids >= 0], ids[ids >= 0]          # null entries hold no block
            slots = ids * block_size + pos % block_size
            for layer, (k_sh, v_sh) in enumerate(shadow[seq][g]):
                k_cache, v_cache = caches[layer]
                idx, at = slots.to(k_cache.device), pos.to(k_sh.device)
                same = ((k_cache.flatten(0, 1)[idx] == k_sh[at]).flatten(1).all(1)
                        & (v_cache.flatten(0, 1)[idx] == v_sh[at]).flatten(1).all(1))
                if not bool(same.all()):
                    p = int(pos[int((~same).nonzero()[0])])
                    block = table[p // block_size]
                    where = f"layer {layer}" if len(kinds) == 1 else f"group {g} layer {layer}"
                    return PoolAudit(len(owners), verified,
                                     f"sequence {seq} token {p} (block {block}, {where}) reads back other "
                                     f"data; block {block} is in the tables of sequences {owners[block]}")
            verified += len(pos)
    return PoolAudit(len(owners), verified, None)
