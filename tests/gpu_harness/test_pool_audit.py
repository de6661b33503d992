"""The pool audit on hand-built pools (plain torch indexing, no kernels)."""

import torch

from gpu_harness.pool_audit import audit_groups, audit_pool

BS, H, D = 4, 2, 3


def pool(num_blocks=6):
    return [(torch.zeros(num_blocks, BS, H, D), torch.zeros(num_blocks, BS, H, D))]


def write(caches, shadow, seq, table, start, end, seed):
    """Write tokens [start, end) of `seq` through `table` into the pool and into its shadow."""
    g = torch.Generator().manual_seed(seed)
    k_sh, v_sh = shadow.setdefault(seq, [(torch.zeros(16, H, D), torch.zeros(16, H, D))])[0]
    k_cache, v_cache = caches[0]
    for p in range(start, end):
        k, v = torch.randn(H, D, generator=g), torch.randn(H, D, generator=g)
        k_sh[p], v_sh[p] = k, v
        k_cache[table[p // BS], p % BS], v_cache[table[p // BS], p % BS] = k, v


def test_distinct_blocks_of_live_sequences_are_counted_and_every_token_verified():
    """Sequence 0 holds 6 tokens in blocks 3, 1; sequence 1 holds 3 in block 0 plus block 5 allocated
    ahead (unwritten, still held): 4 blocks, 9 slots read back."""
    caches, shadow = pool(), {}
    write(caches, shadow, 0, [3, 1], 0, 6, seed=1)
    write(caches, shadow, 1, [0, 5], 0, 3, seed=2)
    audit = audit_pool(caches, BS, {0: [3, 1], 1: [0, 5]}, {0: 6, 1: 3}, shadow)
    assert (audit.held_blocks, audit.verified_slots, audit.problem) == (4, 9, None)


def test_a_shared_block_with_identical_data_counts_once():
    """A forked sample shares the parent's full first block (same data) and has its own second."""
    caches, shadow = pool(), {}
    write(caches, shadow, 0, [2, 4], 0, 5, seed=1)
    shadow[1] = [(shadow[0][0][0].clone(), shadow[0][0][1].clone())]
    write(caches, shadow, 1, [2, 3], 4, 5, seed=7)             # its own token 4 in block 3
    audit = audit_pool(caches, BS, {0: [2, 4], 1: [2, 3]}, {0: 5, 1: 5}, shadow)
    assert (audit.held_blocks, audit.verified_slots, audit.problem) == (3, 10, None)


def test_a_double_booked_block_is_caught_by_readback():
    """Block 2 handed to sequences 0 and 1 at once: 1's writes overwrite 0's first tokens."""
    caches, shadow = pool(), {}
    write(caches, shadow, 0, [2], 0, 3, seed=1)
    write(caches, shadow, 1, [2], 0, 2, seed=2)
    audit = audit_pool(caches, BS, {0: [2], 1: [2]}, {0: 3, 1: 2}, shadow)
    assert audit.problem == ("sequence 0 token 0 (block 2, layer 0) reads back other data; "
                             "block 2 is in the tables of sequences [0, 1]")


def test_a_table_too_short_and_a_leaked_table_are_reported():
    caches, shadow = pool(), {}
    write(caches, shadow, 0, [2, 3], 0, 6, seed=1)
    assert "wrote 6 tokens but its table has 1 blocks" in audit_pool(caches, BS, {0: [2]}, {0: 6}, shadow).problem
    leak = audit_pool(caches, BS, {0: [2, 3], 9: [1]}, {0: 6}, shadow)
    assert leak.problem == "block tables for sequences the harness saw finish or leave: [9]"


def group_pool_write(caches, shadow, seq, g, table, start, end, seed):
    """`write` for group `g` of two (layer 0 of each group pages into caches[0])."""
    groups = shadow.setdefault(seq, [[(torch.zeros(16, H, D), torch.zeros(16, H, D))] for _ in range(2)])
    one = {seq: groups[g]}
    write(caches, one, seq, table, start, end, seed)


def test_groups_skip_null_entries_and_count_each_block_once():
    """Sequence 0: a sliding group whose first two entries are null (tokens 0..7 left the window; tokens
    8..9 in block 4) and a full group with blocks 0, 1, 2 (tokens 0..9): 4 blocks held; readback of 2
    sliding and 10 full slots."""
    caches, shadow = pool(), {}
    group_pool_write(caches, shadow, 0, 0, [-1, -1, 4], 8, 10, seed=1)
    group_pool_write(caches, shadow, 0, 1, [0, 1, 2], 0, 10, seed=2)
    audit = audit_groups(caches, BS, {0: [[-1, -1, 4], [0, 1, 2]]}, {0: 10}, shadow, ["sliding", "full"])
    assert (audit.held_blocks, audit.verified_slots, audit.problem) == (4, 12, None)


def test_a_block_in_two_groups_is_reported():
    """Block 1 in the sliding group of sequence 0 and the full group of sequence 1: the two groups'
    layers share the page (vLLM's layout), so that is double booking even before anything is written."""
    caches, shadow = pool(), {}
    tables = {0: [[1], [0]], 1: [[3], [1]]}
    audit = audit_groups(caches, BS, tables, {0: 0, 1: 0}, shadow, ["sliding", "full"])
    assert audit.problem == "block 1 is held twice: by group 0 of sequences [0] and by group 1 of sequence 1"


def test_a_mamba_state_block_is_counted_and_never_shared():
    caches, shadow = pool(), {}
    ok = audit_groups(caches, BS, {0: [[5], [0]], 1: [[4], [1]]}, {0: 0, 1: 0}, shadow, ["mamba", "full"])
    assert (ok.held_blocks, ok.problem) == (4, None)
    shared = audit_groups(caches, BS, {0: [[5], [0]], 1: [[5], [1]]}, {0: 0, 1: 0}, shadow, ["mamba", "full"])
    assert shared.problem == "block 5 is held twice: by group 0 of sequences [0] and by group 0 of sequence 1"
    # with Mamba prefix caching (vLLM's align mode) a hit shares a cached state: several sequences, once each
    hit = {0: [[-1, 5], [0, 2]], 1: [[-1, 5, 6], [0, 2, 1]]}
    ok = audit_groups(caches, BS, hit, {0: 0, 1: 0}, shadow, ["mamba", "full"], shared_states=True)
    assert (ok.held_blocks, ok.problem) == (5, None)     # (distinct: Mamba 5, 6; full 0, 1, 2)
    twice = audit_groups(caches, BS, {0: [[5, 5], [0]]}, {0: 0}, shadow, ["mamba", "full"], shared_states=True)
    assert twice.problem == "block 5 is held twice: by group 0 of sequences [0] and by group 0 of sequence 0"
