"""Prefix caching in Jenga's allocator (kvsim/alloc/jenga/cache.py), worked by hand on tiny pools: hits
shared across requests (live and freed), a sliding group served by its last window only, a miss after
eviction; the evictor's order (a request's later pages before its earlier ones, a sliding group's pages
that left the window first, a whole idle large page before an older page of a busy one); cached pages
counted free and stranded pages external; a hypothesis state machine with caching on; at one page size
the hits of vLLM's hybrid manager (HybridAllocator) under the scheduler; and `kvsim run --allocator jenga
--prefix-caching` on the Mooncake excerpt.

Page ids are as each group sees the pool: large page x pages per large page + index inside it.
"""

import json
import random
from math import lcm
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from typer.testing import CliRunner

from kvsim.alloc.hybrid import NULL_BLOCK as NULL
from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.alloc.jenga import JengaAllocator, JengaGroup
from kvsim.cli.app import app
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

from tests.quick_examples import examples

FULL2, FULL3 = JengaGroup("full", page_bytes=2), JengaGroup("full", page_bytes=3)


def make(groups, pool_bytes, block_size=1, **kw):
    return JengaAllocator(pool_bytes, block_size, groups, max_model_len=64, max_in_flight_tokens=8,
                          prefix_caching=True, **kw)


def test_a_shared_prefix_is_served_to_a_second_request_live_and_after_free():
    # full (2 bytes: 3 a large page) + sliding W 3 (3 bytes: 2 a large page), block 2, 6 large pages
    a = make([FULL2, JengaGroup("sliding", window=3, page_bytes=3)], 36, block_size=2)
    assert a.allocate(0, 8, 8, [1, 2, 3, 4]) == 0
    full0, slide0 = a.group_block_tables(0)
    # 8 tokens, hashes 1, 2, 3, 9: at most 7 tokens hit = 3 blocks; full: blocks 0-2 cached (6 tokens);
    # sliding W 3 needs cdiv(2, 2) = 1 block, the one ending at token 6: block 2 -> hit 6
    assert a.cached_tokens(8, [1, 2, 3, 9], 1) == 6
    assert a.allocate(1, 8, 8, [1, 2, 3, 9]) == 6
    full1, slide1 = a.group_block_tables(1)
    assert full1[:3] == full0[:3] and full1[3] not in full0
    # skipped_entries(6) = (6 - 3 + 1) // 2 = 2 nulls, then block 2 shared, then a new page
    assert slide1[:3] == [NULL, NULL, slide0[2]] and slide1[3] not in slide0
    a.check_invariants()
    # shared pages count once: tokens written 8 + 8, less 3 shared full pages (6) and, in the sliding
    # group, 2 nulls + 1 shared page (6), x units (2 and 3): full (16 - 6) x 2, sliding (16 - 6) x 3
    assert a.stats().token_states == 10 * 2 + 10 * 3
    a.free(0)
    a.free(1)
    a.check_invariants()
    assert a.stats().token_states == 0 and a.stats().cached_blocks == 5 + 5   # 4 + 1 full, 4 + 1 sliding
    assert a.allocate(2, 9, 9, [1, 2, 3, 4]) == 8           # all 4 blocks of request 0, from the cache
    assert a.group_block_tables(2)[0][:4] == full0
    a.check_invariants()


def test_a_sliding_group_needs_only_its_last_window_and_its_left_pages_go_first():
    # full + sliding W 3 with equal pages of 2 bytes: a large page is one page; 8 of them; block 2
    a = make([FULL2, JengaGroup("sliding", window=3, page_bytes=2)], 16, block_size=2)
    a.allocate(0, 8, 8, [1, 2, 3, 4], hold_tokens=2)         # a chunked prefill, 2 tokens a step
    for _ in range(3):
        a.append(0, 2)
    # growing from 4 and 6 computed tokens dropped sliding blocks 0 and 1 (cached, released early);
    # now 4 full + 2 sliding pages held, 2 cached: the pool is full
    assert a.group_block_tables(0)[1][:2] == [NULL, NULL]
    assert (a.stats().cached_blocks, a.num_free_large) == (2, 0)
    a.free(0)
    assert a.stats().cached_blocks == 8
    # hashes 1, 2, 3, 5: 3 blocks hit in full, sliding block 2 alone serves the window: hit 6; one new
    # page per group: the two cached pages outside any window (sliding blocks 0, 1) are evicted first
    assert a.allocate(1, 8, 8, [1, 2, 3, 5]) == 6
    a.check_invariants()
    assert a.stats().cached_blocks == 2                      # full block 3 and sliding block 3 stay
    a.free(1)
    assert a.cached_tokens(9, [1, 2, 3, 4], 2) == 8          # so request 0's whole prompt still hits


def test_later_pages_are_evicted_before_earlier_ones_then_a_miss():
    a = make([FULL2], 8)                                     # 4 pages of 1 token
    a.allocate(0, 4, 4, [1, 2, 3, 4])
    a.free(0)                                                # 4 cached pages, one release
    a.allocate(1, 2, 2, [7, 8])                              # 2 pages: blocks 3 and 2 evicted, not 0, 1
    assert a.cached_tokens(4, [1, 2, 3, 4], 2) == 2
    a.check_invariants()
    a.free(1)
    a.allocate(2, 4, 4, [9, 10, 11, 12])                     # every page: request 0's blocks are gone
    assert a.cached_tokens(4, [1, 2, 3, 4], 3) == 0
    a.free(2)
    assert a.cached_tokens(5, [9, 10, 11, 12], 3) == 4
    a.check_invariants()


def test_a_whole_idle_large_page_goes_before_an_older_page_of_a_busy_one_and_stats_count_cached_free():
    # pages of 2 (3 a large page) and 3 bytes (2 a large page), 3 large pages, packing (no empty_first)
    a = make([FULL2, FULL3], 18, empty_first=False)
    a.allocate(0, 1, 2, [1])                                 # A page 0 (large 0), B page 2 (large 1)
    a.allocate(1, 1, 2, [2])                                 # A page 1, B page 3
    a.free(0)                                                # A 0, B 2 cached at release 1
    a.allocate(2, 1, 2, [3])                                 # A page 2 (large 0), B opens large 2: page 4
    assert a.group_block_tables(2) == [[2], [4]]
    a.free(2)                                                # A 2, B 4 cached at release 2
    # request 1 holds A 1 (2 slots) + B 3 (3 slots); cached A 0, 2 and B 2, 4 are free (2+2+3+3);
    # large 2's other B page (3 slots) is stranded: external
    s = a.stats()
    assert (s.capacity_tokens, s.token_states, s.free, s.external_fragmentation, s.cached_blocks) == \
        (18, 5, 10, 3, 4)
    assert [(g.free, g.external_fragmentation) for g in a.group_stats()] == [(4, 0), (6, 3)]
    # 2 pages of each group: large 2 (only B 4, cached, inside) is emptied whole first although B 2
    # (release 1) is older; then A's cached pages (oldest first) make room for A
    assert a.can_allocate(2, 2, [7, 8]) and a.can_hold(2, 2, [7, 8])
    a.allocate(3, 2, 2, [7, 8])
    assert a.group_block_tables(3) == [[0, 2], [4, 5]]
    assert a._cache.key_of.keys() >= {(1, 2)} and (1, 4) not in a._cache.stamp
    a.check_invariants()


def test_an_idle_large_page_of_one_kind_is_emptied_for_another():
    # 4 large pages; request 0 fills large 0 with A pages 0-2 and B pages 2, 3 (large 1), 4 (large 2);
    # request 1 opens large 3 for A (page 9) and takes B page 5 beside page 4: no large page is free
    a = make([FULL2, FULL3], 24, empty_first=False)
    a.allocate(0, 3, 3, [1, 2, 3])
    a.allocate(1, 1, 2, [9])
    assert a.group_block_tables(0) == [[0, 1, 2], [2, 3, 4]] and a.group_block_tables(1) == [[9], [5]]
    a.free(0)          # large 0 (A) and large 1 (B) idle, same newest stamp; B 4 cached beside busy B 5
    # B needs a page: rather than B's own cached page 4 (a per-group LRU's pick: the request's latest),
    # an idle large page goes whole (on a tie the lower id: large 0, A's) and B opens it
    a.allocate(2, 1, 1, [7])
    assert a.group_block_tables(2) == [[10], [0]] and a.pool.owner == [1, 1, 1, 0]
    assert set(a._cache.stamp) == {(1, 2), (1, 3), (1, 4)}   # A's pages 0-2 evicted; B's stay cached
    a.check_invariants()


def test_without_the_cache_nothing_changes():
    a = JengaAllocator(18, 1, [FULL2, FULL3], 64, 8)
    a.allocate(0, 2, 2, [1, 2])
    a.free(0)
    assert a.cached_tokens(3, [1, 2], 1) == 0 and a.stats().cached_blocks == 0
    assert a.num_free_large == 3


# ---- a hypothesis state machine with caching on -----------------------------------------------------
kinds = st.one_of(st.just(("full", 0, 0)), st.tuples(st.just("sliding"), st.integers(1, 7), st.just(0)),
                  st.tuples(st.just("chunked"), st.just(0), st.integers(1, 7)))


class CachingMachine(RuleBasedStateMachine):
    """Random groups, page bytes, block sizes and pools; prompts share prefixes of a few content ids.
    After every step: `check_invariants`; a gate that said yes is never refused; a hit is at most the
    longest prefix of whole blocks the request shares with a prompt seen before (with a full group),
    and what `cached_tokens` said just before."""

    @initialize(groups=st.lists(st.tuples(kinds, st.integers(1, 4)), min_size=1, max_size=3),
                bs=st.integers(1, 3), large=st.integers(1, 12), empty_first=st.booleans())
    def setup(self, groups, bs, large, empty_first):
        gs = [JengaGroup(k, w, c, page) for (k, w, c), page in groups]
        self.alloc = make(gs, lcm(*(g.page_bytes for g in gs)) * large, block_size=bs, empty_first=empty_first)
        self.tokens, self.next_id, self.seen = {}, 0, []

    @rule(num=st.integers(1, 20), ids=st.lists(st.integers(0, 2), min_size=0, max_size=6),
          hold=st.integers(1, 8))
    def allocate(self, num, ids, hold):
        a, bs, seq = self.alloc, self.alloc.block_size, self.next_id
        self.next_id += 1
        hold = min(hold, num)
        hashes = ids[:num // bs]
        expect = a.cached_tokens(num, hashes, seq)
        longest = max([_common(hashes, s) for s in self.seen] + [0]) * bs
        assert expect % bs == 0 and expect <= num - 1
        if any(g.kind == "full" for g in a.groups):       # (a chunk's earlier chunks need nothing cached)
            assert expect <= longest
        if a.can_allocate(num, num, hashes, seq) and a.can_hold(hold, num, hashes, seq):
            assert a.allocate(seq, num, num, hashes, hold_tokens=hold) == expect
            self.tokens[seq] = max(hold, expect)
            self.seen.append(hashes)

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99), n=st.integers(1, 4))
    def append(self, index, n):
        seq = sorted(self.tokens)[index % len(self.tokens)]
        if self.alloc.can_append(seq, n):
            self.alloc.append(seq, n)
            self.tokens[seq] += n

    @precondition(lambda self: self.tokens)
    @rule(index=st.integers(0, 99))
    def free(self, index):
        seq = sorted(self.tokens)[index % len(self.tokens)]
        self.alloc.free(seq)
        del self.tokens[seq]

    @invariant()
    def consistent(self):
        if hasattr(self, "alloc"):
            self.alloc.check_invariants()


def _common(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


CachingMachine.TestCase.settings = settings(**examples(150), stateful_step_count=40, deadline=None)
test_caching_state_machine = CachingMachine.TestCase


# ---- the scheduler: the hybrid manager's hits at one page size --------------------------------------
def _run(trace, alloc, budget=8):
    sched = Scheduler(trace, alloc, SchedulerConfig(max_num_seqs=16, max_batched_tokens=budget,
                                                    chunked_prefill=True), 64, 0,
                      lambda i: trace.prompt_block_ids(i, 2))
    for i in range(len(trace)):
        sched.add(i, 0.0)
    stepper, now, steps = Stepper(sched, ConstantCost(1.0)), 0.0, 0
    while (plan := stepper.step(now)) is not None:
        alloc.check_invariants()
        now, steps = plan.end_s, steps + 1
        assert steps < 10_000
    return sched


def test_at_one_page_size_the_hits_are_the_hybrid_managers():
    """40 requests with prompts drawn from 3 shared prefixes; a pool large enough that nothing is
    evicted, so both keep every full page and must find the same hits request by request."""
    rng = random.Random(3)
    n, prompts, hashes = 40, [], []
    for _ in range(n):
        p = rng.randint(4, 14)
        root = rng.randint(0, 2)
        prompts.append(p)
        hashes.append([100 * root + k for k in range(p // 2)][: rng.randint(1, p // 2)])
    trace = Trace.from_arrays([0.0] * n, prompts, [rng.randint(1, 6) for _ in range(n)],
                              block_hashes=hashes, hash_block_size=2)
    specs = [GroupSpec("full"), GroupSpec("sliding", window=4)]
    hybrid = HybridAllocator(400, 2, specs, 64, 8, 8, prefix_caching=True, retention_interval=None)  # (dense, as Jenga)
    sched_h = _run(trace, hybrid)
    jenga = JengaAllocator(400 * 6, 2, [JengaGroup("full", page_bytes=6), JengaGroup("sliding", 4, 0, 6)],
                           64, 8, 8, prefix_caching=True)
    sched_j = _run(trace, jenga)
    assert sched_h.prefix_hit_tokens > 0 and sched_j.num_finished == n
    assert sched_j.prefix_hit_tokens == sched_h.prefix_hit_tokens


def test_cli_run_with_prefix_caching_on_the_mooncake_excerpt(tmp_path):
    excerpt = Path(__file__).parents[3] / "traces" / "mooncake_conversation_excerpt.jsonl"
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["run", str(excerpt), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--max-model-len", "32768", "--allocator", "jenga", "--prefix-caching",
                                   "--hash-block-size", "512", "--max-requests", "60", "--json", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())
    # the excerpt's prompts share 512-token blocks (hash id 0 opens every conversation)
    assert s["prefix_cache_hit_tokens"] > 0 and s["prefix_cache_hit_tokens"] % 16 == 0
