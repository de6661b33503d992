"""Contiguous reservations per KV cache group (issue 23 item 4): a sliding group reserves and writes
its window, not the whole length; worked by hand on a tiny pool, then through the engine."""

from __future__ import annotations

import numpy as np
import pytest

import kvsim
from kvsim.alloc.base import AllocationError
from kvsim.alloc.contiguous.groups import GroupedContiguousAllocator, GroupShare
from kvsim.engine.build import build_run
from kvsim.planning.runs import make_config
from kvsim.trace.table import Trace

# one full group (1 slot per token), one sliding group of window 4 (1 slot per token), a Mamba state of 3
SHARES = [GroupShare("full", 0, 1), GroupShare("sliding", 4, 1), GroupShare("mamba", 0, 3)]


def test_slots_by_hand():
    a = GroupedContiguousAllocator(100, 10, SHARES, reserve="oracle", placement="first-fit")
    assert [a.slots(t) for t in (1, 3, 4, 5, 9)] == [1 + 1 + 3, 3 + 3 + 3, 4 + 4 + 3, 5 + 4 + 3, 9 + 4 + 3]
    # prompt 6, output 3: final 8 tokens (the last token is never written, so prompt + output - 1), oracle
    # reservation 8 -> 8 + 4 + 3 = 15 slots; 6 written -> 6 + 4 + 3 = 13; 2 reserved, none beyond final
    a.allocate(0, 6, 8)
    s = a.stats()
    assert (s.token_states, s.reserved, s.internal_fragmentation, s.free) == (13, 2, 0, 85)
    assert a.num_tokens(0) == 6 and a.decode_window([0], 10) == 2
    a.append(0)                              # 7 tokens: the full group grows, the window is full already
    assert a.stats().token_states == 14 and a.can_append(0, 1) and not a.can_append(0, 2)
    a.check_invariants()
    with pytest.raises(AllocationError):
        a.append(0, 2)
    a.free(0)
    assert a.stats().free == 100
    a.check_invariants()


def test_max_reservation_keeps_only_the_window_of_sliding_layers():
    a = GroupedContiguousAllocator(100, 10, SHARES[:2], reserve="max", placement="first-fit")
    assert a.peak_slots(2, 3) == 10 + 4          # every token of max_len 10 in full, 4 in sliding
    a.allocate(0, 2, 3)
    assert a.stats().internal_fragmentation == 14 - (3 + 3)


def test_engine_uses_it_for_hybrid_models_by_hand():
    """gpt-oss-20b, contiguous `max` at max length 4,096: a request reserves 4,096 tokens of its 12 full
    layers and 128 of its 12 sliding ones, (4,096 + 128) x 12 x 2,048 bytes; the uniform baseline would
    reserve 4,096 x 24 x 2,048. With 1 GiB of KV, 1 GiB // 24,576 bytes per slot unit."""
    cfg = make_config(model="gpt-oss-20b", gpu="h100-80gb", kv_gib=1, max_model_len=4096, allocator="contiguous",
                      placement="first-fit")
    trace = Trace.from_arrays(np.zeros(3), np.array([100, 200, 300]), np.array([10, 10, 10]))
    alloc = build_run(trace, cfg).allocator
    assert type(alloc) is GroupedContiguousAllocator and alloc.unit_bytes == 12 * 2 * 8 * 64 * 2
    assert alloc.capacity_tokens == 1024**3 // alloc.unit_bytes
    assert alloc.peak_slots(100, 109) == 4096 + 128
    r = kvsim.simulate(trace, cfg)
    assert r.summary["requests_finished"] == 3


@pytest.mark.parametrize("seed", range(6))
def test_random_operations_keep_the_invariants(seed):
    """Random admissions, appends and frees; after each, the invariants hold and every sequence's slots
    equal full tokens + min(tokens, 4) + 3 computed here."""
    rng = np.random.default_rng(seed)
    a = GroupedContiguousAllocator(400, 40, SHARES, reserve=("max", "pow2", "oracle")[seed % 3],
                                   placement=("buddy", "first-fit")[seed % 2])
    live: dict[int, int] = {}
    for step in range(300):
        op = rng.integers(3)
        if op == 0:
            num = int(rng.integers(1, 20))
            final = num + int(rng.integers(0, 20))
            if a.can_allocate(num, final):
                a.allocate(step, num, final)
                live[step] = num
        elif op == 1 and live:
            s = int(rng.choice(list(live)))
            if a.can_append(s):
                a.append(s)
                live[s] += 1
        elif live:
            s = int(rng.choice(list(live)))
            a.free(s)
            del live[s]
        a.check_invariants()
        assert a.stats().token_states == sum(t + min(t, 4) + 3 for t in live.values())
