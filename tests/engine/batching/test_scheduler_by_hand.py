"""The continuous-batching scheduler (kvsim/engine/batching/scheduler.py, kvsim/engine/batching/preemption.py) on tiny pools, every
number worked out by hand in the docstrings: swap-out and swap-in order and counts, swap space and its
fallback to recompute, preemption victims and recomputed tokens (one and several sequences), chunked
prefill budget splits, admission limits (max_num_seqs, token budget, memory, forks that do not fit),
separate prompt steps, the fast-forward queries, and the reject of a queued request that cannot fit.

Blocks of 4 slots unless said otherwise. A request with prompt P holds P slots after its prefill (which
emits token 1) and P + g - 1 after emitting g tokens; a decode step first takes the slot for the last
token, so a sequence holding a multiple of 4 slots needs a new block at its next decode. Plans are
compared as `_row`s: the plan's fields that are not empty or zero. Steps run at t = 0, 1, 2, ...
"""

import pytest

from kvsim.alloc.contiguous.allocator import ContiguousAllocator
from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import LIMITS
from kvsim.trace.table import Trace

KV, SEQS, BUDGET = (LIMITS.index(name) for name in ("kv_memory", "max_num_seqs", "token_budget"))
FIELDS = ("prefills", "decodes", "decode_seqs", "decode_context_tokens", "preempted", "swapped_out",
          "swapped_in", "swap_tokens", "recomputed_tokens", "swap_fallbacks", "finished", "limited_by")


def _sched(prompts, outputs, alloc, *, n=1, lazy=False, swap_tokens=0, block_ids=None, per_sample=None,
           **cfg) -> Scheduler:
    """A scheduler with every request queued at 0 (max_seq_len 64); `lazy` False forces the
    per-sequence decode path (kvsim/engine/batching/lazy_decode.py is exact, tests/engine/batching/test_lazy_decode.py)."""
    cfg.setdefault("chunked_prefill", False)
    trace = Trace.from_arrays([0.0] * len(prompts), prompts, outputs, n=n, output_tokens_per_sample=per_sample)
    s = Scheduler(trace, alloc, SchedulerConfig(**cfg), max_seq_len=64, swap_tokens=swap_tokens,
                  block_ids=block_ids)
    s._lazy = s._lazy and lazy
    for i in range(len(prompts)):
        s.add(i, 0.0)
    return s


def _row(plan) -> dict:
    return {f: getattr(plan, f) for f in FIELDS if getattr(plan, f) not in ([], 0)}


def _run(s: Scheduler, limit: int = 40):
    """Step until done: per step (plan, swap slots in use after it, memory while it runs). After each
    step the scheduler's counters must equal what they count: sequences of the running requests, and
    the swap space the swapped-out requests hold (all their sequences' slots)."""
    out = []
    for t in range(limit):
        plan = s.schedule(float(t))
        if plan is None:
            break
        mem = s.alloc.stats()
        s.finish(plan, float(t))
        s.alloc.check_invariants()
        assert s.running_seqs == sum(s.n[i] for i in s.running)
        assert s.swap_used == sum(s.kv_len[i] * s.n[i] for i in s.swapped)
        out.append((plan, s.swap_used, mem))
    return out


# -- swap ----------------------------------------------------------------------------------------
# A: prompt 8, 4 outputs; B: prompt 4, 3 outputs; C: prompt 3, 3 outputs; 4 blocks in all.
SWAP_TRACE = ([8, 4, 3], [4, 3, 3])


@pytest.mark.parametrize("lazy, chunked", [(False, False), (True, False), (False, True)])
def test_swap_out_two_at_once_and_back_in_fcfs(lazy, chunked):
    """Swap space 8 slots (the same steps with chunked prefill: the default budget holds every prompt).
    step 0: all three prefill: A 2 blocks, B 1, C 1 (none free); 8 + 4 + 3 = 15 tokens.
    step 1: A's 9th slot needs a block: C (last admitted) goes, 3 slots to CPU, A takes its block; B's
            5th slot needs one too: B goes (4 slots). 7 slots swapped out, swap space 7/8 used. A alone
            decodes (context 9).
    step 2: swap-in, oldest swap-out first: C needs 3 + 1 = 4 slots = 1 block, 1 is free: in (3 slots
            back); B needs 5 = 2 blocks: waits. Decodes A (10) and C (4): context 14; swap space 4.
    step 3: A's 11th fits; C's 5th needs a block, none: C goes again (4 slots; 4 + 4 = 8 <= 8 fits the
            swap space exactly). A emits its 4th token and finishes: its 3 blocks free (4 free).
    step 4: B (swapped before C) then C come back: 5 slots = 2 blocks each, 8 slots over PCIe; context
            5 + 5 = 10; C emits its 3rd token and finishes. While it runs B holds 5 of its 8 slots and
            will reach 4 + 3 - 1 = 6 (1 reserved, 2 internal fragmentation), C holds 5 and ends at 5
            (3 internal fragmentation).
    step 5: B decodes (6) and finishes.
    Totals: 3 swap-outs, 3 swap-ins, 7 + 3 + 4 + 8 = 22 slots moved, 0 recomputed."""
    s = _sched(*SWAP_TRACE, PagedAllocator(4, 4), lazy=lazy, swap_tokens=8, preemption="swap",
               chunked_prefill=chunked)
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps] == [
        {"prefills": [(0, 8), (1, 4), (2, 3)], "limited_by": BUDGET},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 9, "preempted": [2, 1],
         "swapped_out": [2, 1], "swap_tokens": 7, "limited_by": KV},
        {"decodes": [0, 2], "decode_seqs": 2, "decode_context_tokens": 14, "swapped_in": [2],
         "swap_tokens": 3, "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 11, "preempted": [2],
         "swapped_out": [2], "swap_tokens": 4, "finished": [0], "limited_by": KV},
        {"decodes": [1, 2], "decode_seqs": 2, "decode_context_tokens": 10, "swapped_in": [1, 2],
         "swap_tokens": 8, "finished": [2], "limited_by": KV},
        {"decodes": [1], "decode_seqs": 1, "decode_context_tokens": 6, "finished": [1], "limited_by": BUDGET}]
    assert [used for _, used, _ in steps] == [0, 7, 4, 8, 0, 0]
    assert [p.allocated for p, _, _ in steps[2:5]] == [[(2, 0)], [], [(1, 0), (2, 0)]]
    mem = steps[4][2]
    assert (mem.token_states, mem.reserved, mem.internal_fragmentation, mem.free) == (10, 1, 5, 0)
    assert (s.num_preemptions, s.num_swap_outs, s.num_swap_ins, s.swapped_tokens) == (3, 3, 3, 22)
    assert (s.preemptions, s.recomputed_tokens, s.swap_fallbacks) == ([0, 1, 2], 0, 0)
    assert s.generated == [4, 3, 3] and s.num_finished == 3


def test_swap_in_reuses_nothing_from_the_prefix_cache():
    """The same trace over a prefix-caching pool (no shared prompt content): the same steps, swaps and
    counts as without the cache (swap-in looks up no content ids)."""
    s = _sched(*SWAP_TRACE, PagedAllocator(4, 4, prefix_caching=True), swap_tokens=8, preemption="swap")
    steps = _run(s)
    assert [(p.preempted, p.swapped_in, p.swap_tokens) for p, _, _ in steps] == [
        ([], [], 0), ([2, 1], [], 7), ([], [2], 3), ([2], [], 4), ([], [1, 2], 8), ([], [], 0)]
    assert (s.num_swap_outs, s.num_swap_ins, s.swapped_tokens, s.generated) == (3, 3, 22, [4, 3, 3])


def test_full_swap_space_falls_back_to_recompute():
    """Swap space 7 slots: steps 0-2 as with 8 (7 used after step 1, 4 after step 2). Step 3: C's 4
    slots do not fit (4 + 4 > 7): recomputed instead, 4 computed slots dropped, one fallback; A finishes.
    Step 4: B comes back (5 slots, 2 blocks; swap space 0), C (waiting, strict FCFS behind the swap-in)
    is not admitted in a swap-in step. Step 5: C re-prefills its prompt and 2 outputs = 5 tokens (2
    blocks, 4 free before: B's 6th slot fits its 2 blocks) beside B's decode; both finish."""
    s = _sched(*SWAP_TRACE, PagedAllocator(4, 4), swap_tokens=7, preemption="swap")
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps[3:]] == [
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 11, "preempted": [2],
         "recomputed_tokens": 4, "swap_fallbacks": 1, "finished": [0], "limited_by": KV},
        {"decodes": [1], "decode_seqs": 1, "decode_context_tokens": 5, "swapped_in": [1], "swap_tokens": 4,
         "limited_by": KV},
        {"prefills": [(2, 5)], "decodes": [1], "decode_seqs": 1, "decode_context_tokens": 6,
         "finished": [2, 1], "limited_by": BUDGET}]
    assert [used for _, used, _ in steps] == [0, 7, 4, 4, 0, 0]
    assert (s.num_swap_outs, s.num_swap_ins, s.swapped_tokens, s.swap_fallbacks) == (2, 2, 7 + 3 + 4, 1)
    assert (s.recomputed_tokens, s.num_preemptions, s.generated) == (4, 3, [4, 3, 3])


@pytest.mark.parametrize("lazy", [False, True])
def test_no_swap_space_recomputes_both_victims_of_one_step(lazy):
    """Swap space 0: step 1 preempts C then B as above, both recomputed: 3 + 4 = 7 computed slots
    dropped and 2 fallbacks in that one step. A runs alone to its end (steps 1-3, 1 block free). Step 4:
    B re-prefills 4 + 1 = 5 tokens (2 blocks), C 3 + 1 = 4 (1 block): 1 of the 4 blocks left free.
    Step 5: both decode (6 + 5 = 11 context) and finish."""
    s = _sched(*SWAP_TRACE, PagedAllocator(4, 4), lazy=lazy, swap_tokens=0, preemption="swap")
    steps = _run(s)
    rows = [_row(p) for p, _, _ in steps]
    assert rows[1] == {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 9, "preempted": [2, 1],
                       "recomputed_tokens": 7, "swap_fallbacks": 2, "limited_by": KV}
    assert rows[4] == {"prefills": [(1, 5), (2, 4)], "limited_by": BUDGET}
    assert rows[5] == {"decodes": [1, 2], "decode_seqs": 2, "decode_context_tokens": 11, "finished": [1, 2],
                       "limited_by": BUDGET}
    assert steps[4][2].free_blocks == 1
    assert (s.recomputed_tokens, s.swap_fallbacks, s.num_swap_outs, s.num_preemptions) == (7, 2, 0, 2)


def test_recompute_counts_no_fallback_and_swaps_no_single_sequence():
    """Recompute with swap_multi_seq (which swaps only requests of several sequences): the same steps
    as with no swap space, but no swap fallbacks: recompute was asked for."""
    s = _sched(*SWAP_TRACE, PagedAllocator(4, 4), swap_tokens=100, swap_multi_seq=True)
    steps = _run(s)
    assert [(p.preempted, p.recomputed_tokens, p.swap_fallbacks, p.swap_tokens) for p, _, _ in steps[:2]] \
        == [([], 0, 0, 0), ([2, 1], 7, 0, 0)]
    assert steps[4][0].prefills == [(1, 5), (2, 4)] and steps[4][2].free_blocks == 1
    assert (s.recomputed_tokens, s.swap_fallbacks, s.num_swap_outs, s.swap_used) == (7, 0, 0, 0)


# -- several sequences -----------------------------------------------------------------------------
# R0: prompt 8, one sequence; R1: prompt 4, n = 2 (its samples share the prompt's one full block).

def test_two_samples_swap_out_and_come_back_unshared_only_when_both_fit():
    """5 blocks. step 0: R0 2 blocks, R1 1 shared (2 free). step 1: R0's 9th slot takes a block, R1's
    first sample its 5th slot's block, the second finds none: R1 goes to CPU, 2 x 4 = 8 slots, freeing
    its 2 blocks. steps 2-3: R1's samples come back unshared, 4 + 1 = 5 slots = 2 blocks each: the first
    fits the 2 free blocks, the second does not, so the first is given back (still 2 free). R0 finishes
    at step 3 (3 blocks back: 5 free). step 4: both samples in (4 blocks), 8 slots over PCIe, 2
    sequences of 5 decode (context 10). step 5: 2 x 6 = 12, R1 finishes."""
    s = _sched([8, 4], [4, 3], PagedAllocator(5, 4), n=[1, 2], swap_tokens=100, preemption="swap")
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps[1:]] == [
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 9, "preempted": [1], "swapped_out": [1],
         "swap_tokens": 8, "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 10, "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 11, "finished": [0], "limited_by": KV},
        {"decodes": [1], "decode_seqs": 2, "decode_context_tokens": 10, "swapped_in": [1], "swap_tokens": 8,
         "limited_by": KV},
        {"decodes": [1], "decode_seqs": 2, "decode_context_tokens": 12, "finished": [1], "limited_by": BUDGET}]
    assert [used for _, used, _ in steps] == [0, 8, 8, 8, 0, 0]
    assert [m.free_blocks for _, _, m in steps] == [2, 2, 2, 2, 1, 1]
    assert steps[4][0].allocated == [(2, 0), (3, 0)]
    assert (s.num_swap_outs, s.num_swap_ins, s.swapped_tokens, s.generated) == (1, 1, 16, [4, 3])


def test_two_samples_that_could_not_come_back_unshared_are_recomputed_not_swapped():
    """Swap-in restores each sample unshared (4 + 1 = 5 slots = 2 blocks each here), so a request of
    several sequences is swapped out only if all its samples at their peak (4 + 3 - 1 = 6 slots = 2
    blocks each, 4 blocks) fit the whole cache; else it is recomputed, which shares its prompt again.
    (It used to be swapped out of a 3-block cache and never come back: the run ended with it and the
    request queued behind it unfinished.)
    3 blocks, R2: prompt 4, 2 outputs, queued behind. step 0: R0 2 blocks, R1 1 shared, R2 waits.
    step 1: R0's 9th slot needs a block: R1 goes, 4 blocks > 3: recomputed (its prompt, 4 slots).
    steps 2-3: R0 decodes (10, 11) and finishes. step 4: R1 re-prefills its prompt once and each
    sample's first token, 4 + 2 = 6 tokens: 1 shared block + 1 own each (3 blocks); R2 waits.
    step 5: R1's 2 sequences of 6 (context 12), done. steps 6-7: R2 prefills 4, decodes 5.
    4 blocks (R2 left out): the samples' peaks fit exactly: R1 is swapped out (2 x 4 = 8 slots) and
    both samples come back (2 blocks each) once R0 has finished, at step 4."""
    s = _sched([8, 4, 4], [4, 3, 2], PagedAllocator(3, 4), n=[1, 2, 1], swap_tokens=100, preemption="swap")
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps] == [
        {"prefills": [(0, 8), (1, 4)], "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 9, "preempted": [1], "recomputed_tokens": 4,
         "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 10, "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 11, "finished": [0], "limited_by": KV},
        {"prefills": [(1, 6)], "limited_by": KV},
        {"decodes": [1], "decode_seqs": 2, "decode_context_tokens": 12, "finished": [1], "limited_by": KV},
        {"prefills": [(2, 4)], "limited_by": BUDGET},
        {"decodes": [2], "decode_seqs": 1, "decode_context_tokens": 5, "finished": [2], "limited_by": BUDGET}]
    assert (s.generated, s.num_swap_outs, s.swap_fallbacks) == ([4, 3, 2], 0, 0)
    s = _sched([8, 4], [4, 3], PagedAllocator(4, 4), n=[1, 2], swap_tokens=100, preemption="swap")
    steps = _run(s)
    assert [(p.swapped_out, p.swapped_in, p.swap_tokens) for p, _, _ in steps] == [
        ([], [], 0), ([1], [], 8), ([], [], 0), ([], [], 0), ([], [1], 8), ([], [], 0)]
    assert s.generated == [4, 3]


@pytest.mark.parametrize("outputs, swapped", [(3, True), (4, False)])
def test_swap_needs_the_unshared_peaks_to_fit_exactly(outputs, swapped):
    """Blocks of 1 slot, 12 in all. R0: prompt 8, 4 outputs; R1: prompt 4, n = 2. Step 0 fills the
    cache (8 + 4 shared); step 1 R0's 9th slot preempts R1. Its samples' peaks unshared: 3 outputs:
    2 x (4 + 3 - 1) = 12 <= 12: swapped (2 x 4 slots); 4 outputs: 2 x 7 = 14 > 12: recomputed (4).
    R0 finishes at step 3. Step 4: swapped, both samples come back (2 x 5 slots) and decode (context
    10); recomputed, the prompt once and each sample's first token: 6 tokens. Then 2 x 6 = 12 (and
    2 x 7 = 14 with 4 outputs) until R1 ends."""
    s = _sched([8, 4], [4, outputs], PagedAllocator(12, 1), n=[1, 2], swap_tokens=100, preemption="swap")
    steps = _run(s)
    one = steps[1][0]
    assert (one.preempted, one.swapped_out, one.swap_tokens, one.recomputed_tokens) == (
        ([1], [1], 8, 0) if swapped else ([1], [], 0, 4))
    four = steps[4][0]
    assert (four.swapped_in, four.prefills, four.decode_context_tokens) == (
        ([1], [], 10) if swapped else ([], [(1, 6)], 0))
    assert [p.decode_context_tokens for p, _, _ in steps[5:]] == ([12] if swapped else [12, 14])
    assert s.generated == [4, outputs]


def test_recompute_of_two_samples_right_after_their_prefill():
    """As above under recompute: R1 goes at step 1 having computed only its prompt (4 slots; its first
    tokens were sampled but never written): 4 recomputed. It comes back at step 4 with the prompt once
    and each sample's first token: 4 + 2 x 1 = 6 tokens (attention 6 x 6)."""
    s = _sched([8, 4], [4, 3], PagedAllocator(5, 4), n=[1, 2])
    steps = _run(s)
    assert (steps[1][0].preempted, steps[1][0].recomputed_tokens) == ([1], 4)
    assert (steps[4][0].prefills, steps[4][0].prefill_attn_tokens, steps[4][0].forked) == ([(1, 6)], 36, [(2, 3)])
    assert s.recomputed_tokens == 4 and s.generated == [4, 3]


@pytest.mark.parametrize("budget, step6_limit", [(12, BUDGET), (16, KV)])
def test_recompute_of_two_samples_with_outputs(budget, step6_limit):
    """6 blocks. R0: prompt 8, 7 outputs; R1: prompt 4, 8 outputs, n = 2.
    step 0: R0 8 tokens, R1 4 (with a budget of 12: exactly what is left): both admitted, 3 blocks.
    step 1: R0 9 (block 3), R1's samples 5 each (1 block each): context 9 + 2 x 5 = 19, none free.
    steps 2-4: contexts 22, 25, 28 (no new blocks).
    step 5: R0's 13th slot needs a block: R1 goes (8 slots each, 5 tokens emitted): it computed the
            prompt once and 4 slots per sample: 8 + 4 = 12 dropped; its 2 own blocks and the shared one
            free (R0 takes 1: 2 free).
    step 6: R1 would re-prefill the prompt once and each sample's 5 outputs: 4 + 2 x 5 = 14 tokens.
            Budget 12: 14 > 12 - 1 (R0's decode): the budget stops it. Budget 16: it fits the budget;
            the prompt takes 1 block (1 free left), the fork none, then each sample's 5 outputs make 9
            slots = 2 more blocks each: does not fit, undone (2 free again): memory stops it.
    step 7 (R0 finished): the 14 tokens alone (over a budget of 12 too: a lone prefill may; attention
            14 x 14): blocks 1 shared + 2 x 2 own = 5 (1 free).
    steps 8-9: 2 sequences of 10 then 11: contexts 20, 22."""
    s = _sched([8, 4], [7, 8], PagedAllocator(6, 4), n=[1, 2], max_batched_tokens=budget)
    steps = _run(s)
    rows = [_row(p) for p, _, _ in steps]
    assert rows[0] == {"prefills": [(0, 8), (1, 4)], "limited_by": BUDGET}
    assert [r.get("decode_context_tokens") for r in rows] == [None, 19, 22, 25, 28, 13, 14, None, 20, 22]
    assert (rows[5]["preempted"], rows[5]["recomputed_tokens"]) == ([1], 12)
    assert (rows[6]["limited_by"], steps[6][2].free_blocks) == (step6_limit, 2)
    assert (steps[7][0].prefills, steps[7][0].prefill_attn_tokens, steps[7][2].free_blocks) == ([(1, 14)], 196, 1)
    assert s.recomputed_tokens == 12 and s.generated == [7, 8]


def test_forks_that_do_not_fit_contiguous_memory_are_undone():
    """Contiguous first fit, 16 slots, reservations of each sequence's peak. R0 (prompt 4, 5 outputs)
    reserves 8; R1 (prompt 4, 3 outputs, n = 2) needs 6 per sample: the first fits the 8 free slots,
    the fork does not (2 left), so R1 is undone and memory limits it until R0 finishes (step 4). Step 5
    R1 prefills 4 (both samples: 12 slots), steps 6-7 decode 2 sequences (10, 12)."""
    s = _sched([4, 4], [5, 3], ContiguousAllocator(16, 64, reserve="oracle", placement="first-fit"), n=[1, 2])
    steps = _run(s)
    assert [p.limited_by for p, _, _ in steps] == [KV, KV, KV, KV, KV, BUDGET, BUDGET, BUDGET]
    assert [m.used_blocks for _, _, m in steps] == [8, 8, 8, 8, 8, 12, 12, 12]
    assert (steps[5][0].prefills, steps[5][0].forked) == ([(1, 4)], [(2, 3)])
    assert [p.decode_context_tokens for p, _, _ in steps[5:]] == [0, 10, 12]
    assert s.generated == [5, 3]


# -- chunked prefill -------------------------------------------------------------------------------

def test_chunks_split_the_budget():
    """Token budget 8, 6 blocks. A: prompt 11, 2 outputs; B: prompt 9, 2 outputs.
    step 0: A's first chunk 8 (2 blocks; attention 8 x 8 = 64); the budget is spent: B waits.
    step 1: A's last 3 (3 blocks; 3 x 11 = 33); 5 left: B's whole 9 fit the 3 free blocks (vLLM checks
            the whole prompt), its first chunk of 5 takes 2 (5 x 5 = 25); 1 free.
    step 2: A decodes its 12th slot (its 3 blocks hold it) and finishes; B's last 4 with the 7 tokens
            left (its third block; 4 x 9 = 36): 6 blocks used.
    step 3: B decodes (10) and finishes."""
    s = _sched([11, 9], [2, 2], PagedAllocator(6, 4), chunked_prefill=True, max_batched_tokens=8)
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps] == [
        {"prefills": [(0, 8)], "limited_by": BUDGET},
        {"prefills": [(0, 3), (1, 5)], "limited_by": BUDGET},
        {"prefills": [(1, 4)], "decodes": [0], "decode_seqs": 1, "decode_context_tokens": 12, "finished": [0],
         "limited_by": BUDGET},
        {"decodes": [1], "decode_seqs": 1, "decode_context_tokens": 10, "finished": [1], "limited_by": BUDGET}]
    assert [p.prefill_attn_tokens for p, _, _ in steps] == [64, 33 + 25, 36, 0]
    assert [m.used_blocks for _, _, m in steps] == [2, 5, 6, 3]


def test_a_chunk_that_does_not_fit_preempts_its_request():
    """Token budget 8, 6 blocks. A: prompt 12, 3 outputs; B: prompt 9, 3 outputs.
    step 0: A's first chunk 8 (2 blocks). step 1: A's last 4 (3 blocks), B's 9 fit the 3 free blocks,
            its first chunk of 4 takes 1 (2 free).
    step 2: A decodes its 13th slot (a 4th block: 1 free), 7 tokens left for B's last 5, which need
            2 more blocks: B (the last admitted, the one growing) is preempted, recompute: it had
            computed 4 of its 9 slots: 4 dropped.
    step 3: A decodes (14) and finishes; B's 9 need 3 blocks, 2 are free: memory stops it.
    steps 4-5: B's chunks 8 (attention 64) and 1 (1 x 9); steps 6-7 decode (10, 11)."""
    s = _sched([12, 9], [3, 3], PagedAllocator(6, 4), chunked_prefill=True, max_batched_tokens=8)
    steps = _run(s)
    assert [_row(p) for p, _, _ in steps] == [
        {"prefills": [(0, 8)], "limited_by": BUDGET},
        {"prefills": [(0, 4), (1, 4)], "limited_by": BUDGET},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 13, "preempted": [1],
         "recomputed_tokens": 4, "limited_by": KV},
        {"decodes": [0], "decode_seqs": 1, "decode_context_tokens": 14, "finished": [0], "limited_by": KV},
        {"prefills": [(1, 8)], "limited_by": BUDGET},
        {"prefills": [(1, 1)], "limited_by": BUDGET},
        {"decodes": [1], "decode_seqs": 1, "decode_context_tokens": 10, "limited_by": BUDGET},
        {"decodes": [1], "decode_seqs": 1, "decode_context_tokens": 11, "finished": [1], "limited_by": BUDGET}]
    assert [p.prefill_attn_tokens for p, _, _ in steps[:2]] == [64, 48 + 16]
    assert [p.prefill_attn_tokens for p, _, _ in steps[4:6]] == [64, 9]
    assert [m.free_blocks for _, _, m in steps] == [4, 2, 2, 2, 4, 3, 3, 3]
    assert s.recomputed_tokens == 4 and s.generated == [3, 3]


@pytest.mark.parametrize("num_blocks", [4, 5])
def test_the_last_admitted_goes_when_its_chunk_or_a_decode_slot_does_not_fit(num_blocks):
    """Token budget 4. X, Y: prompt 2, 6 outputs; A: prompt 5, 6 outputs.
    step 0: X 2 and Y 2 spend the budget (1 block each).
    step 1: X, Y decode their 3rd slots (context 6), 2 tokens left: A's 5 fit 2 free blocks, its
            first chunk of 2 takes 1 block (attention 2 x 2).
    step 2: X, Y 4th slots (8); A's next 2 fill its block (2 x 4).
    step 3: X and Y's 5th slots need a block each. 4 blocks: 1 is free: X takes it, Y finds none and A
            (the last admitted, mid-prefill, not decoding) goes: Y takes A's block and both decode.
            5 blocks: X and Y take the 2 free ones; A's last token needs a block, none: A goes.
            Either way A had computed 4 of its 5 prompt slots: 4 recomputed; 0 blocks free after.
    steps 4-5: X, Y decode (12, 14) and finish. step 6-7: A's chunks 4 and 1 (4 x 4, 1 x 5)."""
    s = _sched([2, 2, 5], [6, 6, 6], PagedAllocator(num_blocks, 4), chunked_prefill=True, max_batched_tokens=4)
    steps = _run(s)
    assert [(p.prefills, p.decodes, p.decode_context_tokens, p.prefill_attn_tokens) for p, _, _ in steps[:8]] == [
        ([(0, 2), (1, 2)], [], 0, 8), ([(2, 2)], [0, 1], 6, 4), ([(2, 2)], [0, 1], 8, 8), ([], [0, 1], 10, 0),
        ([], [0, 1], 12, 0), ([], [0, 1], 14, 0), ([(2, 4)], [], 0, 16), ([(2, 1)], [], 0, 5)]
    assert (steps[3][0].preempted, steps[3][0].recomputed_tokens, steps[3][2].free_blocks) == ([2], 4, num_blocks - 4)
    assert s.generated == [6, 6, 6]


def test_two_samples_take_their_whole_prompt_before_its_first_chunk():
    """Token budget 4, 10 blocks, n = 2, prompt 10, 3 outputs: the prompt's 3 blocks are taken at
    admission and shared by the fork (7 free); chunks 4, 4, 2 (attention 4 x 4, 4 x 8, 2 x 10). The
    first decode writes slot 11 of each sample into the shared, partly filled third block: one copy
    (6 free); context 2 x 11, then 2 x 12."""
    s = _sched([10], [3], PagedAllocator(10, 4), n=[2], chunked_prefill=True, max_batched_tokens=4)
    steps = _run(s)
    assert [(p.prefills, p.prefill_attn_tokens, p.decode_context_tokens) for p, _, _ in steps] == [
        ([(0, 4)], 16, 0), ([(0, 4)], 32, 0), ([(0, 2)], 20, 0), ([], 0, 22), ([], 0, 24)]
    assert [m.free_blocks for _, _, m in steps] == [7, 7, 7, 6, 6]


def test_a_recomputed_request_may_exceed_the_budget_alone():
    """Token budget 4, 3 blocks, whole prompts. A: prompt 4, 8 outputs; B: prompt 3, 4 outputs.
    step 0: A's 4 spend the budget. step 1: A decodes (5th slot, 2nd block), B's 3 fit the 3 tokens
    left (the last block). step 2: A 6, B 4. step 3: A 7; B's 5th slot needs a block, none: B (last)
    goes, 4 slots recomputed. steps 3-7: B's 3 + 2 = 5 tokens need 2 blocks, at most 1 is free (A
    reaches 3 blocks at its 9th slot); A finishes at step 7. step 8: B's 5 alone, over the budget of 4
    (it could never run otherwise): 2 blocks, 1 free; step 9: B's last token."""
    s = _sched([4, 3], [8, 4], PagedAllocator(3, 4), max_batched_tokens=4)
    steps = _run(s)
    assert [p.prefills for p, _, _ in steps] == [[(0, 4)], [(1, 3)]] + [[]] * 6 + [[(1, 5)], []]
    assert (steps[3][0].preempted, steps[3][0].recomputed_tokens) == ([1], 4)
    assert [m.free_blocks for _, _, m in steps] == [2, 0, 0, 1, 1, 0, 0, 0, 1, 1]
    assert [p.limited_by for p, _, _ in steps[3:9]] == [KV] * 5 + [BUDGET]
    assert s.generated == [8, 4]


def test_a_prefill_continues_with_what_the_decodes_leave_of_the_budget():
    """Token budget 4. D1 (n = 2), D2, D3: prompt 1, 6 outputs; A: prompt 10, 2 outputs.
    step 0: D1 1 token (its samples fork), D2 1, D3 1, then A's first chunk 1: the budget is spent.
    steps 1-5: D1's 2 sequences and D2, D3 decode: 4 sequences take the whole budget, A gets nothing
            (and nobody else is admitted); they finish at step 5.
    steps 6-8: A alone: chunks 4, 4 and 1 (attention 4 x 5, 4 x 9, 1 x 10); step 9 decodes (11)."""
    s = _sched([1, 1, 1, 10], [6, 6, 6, 2], PagedAllocator(40, 4), n=[2, 1, 1, 1], chunked_prefill=True,
               max_batched_tokens=4)
    steps = _run(s)
    assert [p.prefills for p, _, _ in steps] == [[(0, 1), (1, 1), (2, 1), (3, 1)], [], [], [], [], [],
                                                 [(3, 4)], [(3, 4)], [(3, 1)], []]
    assert [p.decode_seqs for p, _, _ in steps] == [0, 4, 4, 4, 4, 4, 0, 0, 0, 1]
    assert [p.prefill_attn_tokens for p, _, _ in steps[6:9]] == [20, 36, 10]
    assert s.generated == [6, 6, 6, 2]


def test_a_budget_of_one_token_left_is_still_a_chunk():
    """Token budget 4. D1, D2, D3: prompt 1, 4 outputs; A: prompt 5, 2 outputs. step 0: the three
    prompts then A's first chunk of 1 (budget 4 - 3). steps 1-3: three decodes leave 1 token: A's chunks
    1, 1, 1 (attention 1 x 2, 1 x 3, 1 x 4). step 4: A's last chunk (1 x 5) beside nothing: the
    decodes finished at step 3. step 5: A decodes (6)."""
    s = _sched([1, 1, 1, 5], [4, 4, 4, 2], PagedAllocator(40, 4), chunked_prefill=True, max_batched_tokens=4)
    steps = _run(s)
    assert [p.prefills for p, _, _ in steps] == [[(0, 1), (1, 1), (2, 1), (3, 1)], [(3, 1)], [(3, 1)],
                                                 [(3, 1)], [(3, 1)], []]
    assert [p.prefill_attn_tokens for p, _, _ in steps] == [4, 2, 3, 4, 5, 0]
    assert s.generated == [4, 4, 4, 2]


def test_a_decoding_request_before_a_chunk_gets_no_chunk():
    """Token budget 4. D: prompt 3, 4 outputs; A: prompt 10, 2 outputs. step 0: D 3, A's first chunk 1.
    steps 1-3: D decodes (1 token), A's chunks 3, 3, 3 (attention 3 x 4, 3 x 7, 3 x 10); D finishes at
    step 3; step 4: A decodes (11). Blocks: D 1 then 2 from its 5th slot (step 2); A 1, 1, 2, 3."""
    s = _sched([3, 10], [4, 2], PagedAllocator(40, 4), chunked_prefill=True, max_batched_tokens=4)
    steps = _run(s)
    assert [(p.prefills, p.decodes, p.prefill_attn_tokens) for p, _, _ in steps] == [
        ([(0, 3), (1, 1)], [], 9 + 1), ([(1, 3)], [0], 12), ([(1, 3)], [0], 21), ([(1, 3)], [0], 30),
        ([], [1], 0)]
    assert [m.used_blocks for _, _, m in steps] == [2, 2, 4, 5, 3]


# -- admission -------------------------------------------------------------------------------------

@pytest.mark.parametrize("lazy", [False, True])
def test_admission_stops_at_max_num_seqs(lazy):
    """max_num_seqs 2, plenty of memory and budget: A and B (prompt 4, 2 outputs) are admitted, C waits
    (limited by max_num_seqs) until they finish at step 1, then prefills alone at step 2."""
    s = _sched([4, 4, 4], [2, 2, 2], PagedAllocator(20, 4), lazy=lazy, max_num_seqs=2)
    steps = _run(s)
    assert [(p.prefills, p.limited_by) for p, _, _ in steps] == [
        ([(0, 4), (1, 4)], SEQS), ([], SEQS), ([(2, 4)], BUDGET), ([], BUDGET)]
    assert list(s.admitted_s) == [0.0, 0.0, 2.0]


@pytest.mark.parametrize("lazy", [False, True])
def test_admission_stops_at_the_token_budget(lazy):
    """Budget 10, plenty of memory. step 0: A (prompt 6) fits, B (prompt 5) would make 11 > 10: waits.
    step 1: A decodes (1 token): 9 left: B's 5, then C's 4 fill it exactly; D waits (budget)."""
    s = _sched([6, 5, 4, 4], [3, 3, 3, 3], PagedAllocator(20, 4), lazy=lazy, max_batched_tokens=10)
    steps = _run(s)
    assert [(p.prefills, p.limited_by) for p, _, _ in steps[:3]] == [
        ([(0, 6)], BUDGET), ([(1, 5), (2, 4)], BUDGET), ([(3, 4)], BUDGET)]
    assert list(s.admitted_s) == [0.0, 1.0, 1.0, 2.0]


@pytest.mark.parametrize("lazy", [False, True])
def test_admission_stops_at_memory(lazy):
    """3 blocks: A (prompt 8) takes 2, B (prompt 8) needs 2 of the 1 left: waits (memory) while A
    decodes its 9th slot (the third block) and finishes at step 1; B prefills at step 2."""
    s = _sched([8, 8], [2, 2], PagedAllocator(3, 4), lazy=lazy)
    steps = _run(s)
    assert [(p.prefills, p.limited_by) for p, _, _ in steps] == [
        ([(0, 8)], KV), ([], KV), ([(1, 8)], BUDGET), ([], BUDGET)]


def test_separate_prompt_steps():
    """separate_prefill (vLLM v0), max_num_seqs 2. step 0: A and B prefill alone (batch of 2), C waits
    for a sequence slot. steps 1-2: they decode, C still waits (limited by max_num_seqs); they finish.
    step 3: C's prompt alone; step 4: C decodes, nothing waits (no limit)."""
    s = _sched([4, 4, 4], [3, 3, 2], PagedAllocator(10, 4), separate_prefill=True, max_num_seqs=2)
    steps = _run(s)
    assert [(p.prefills, p.decodes, p.limited_by, p.batch_requests) for p, _, _ in steps] == [
        ([(0, 4), (1, 4)], [], SEQS, 2), ([], [0, 1], SEQS, 2), ([], [0, 1], SEQS, 2),
        ([(2, 4)], [], BUDGET, 1), ([], [2], 0, 1)]
    assert list(s.admitted_s) == [0.0, 0.0, 3.0]


def test_prefix_hits_add_up_over_admissions():
    """Prefix caching, blocks of 4: three prompts of 8 whose first block has the same content. A
    computes it; B and C, admitted in the same step, each find it cached: 4 + 4 = 8 hit tokens."""
    s = _sched([8, 8, 8], [2, 2, 2], PagedAllocator(20, 4, prefix_caching=True),
               block_ids=lambda i: [7, 100 + i])
    steps = _run(s)
    assert steps[0][0].allocated == [(0, 0), (1, 4), (2, 4)]
    assert s.prefix_hit_tokens == 8 and s.admitted_prompt_tokens == 24


def test_a_queued_request_that_cannot_fit_the_empty_cache_is_rejected():
    """A request queued past the arrival check (here: put in the queue directly) that needs 3 blocks of
    an empty 2-block pool is rejected at once, and the next one runs in the same call."""
    trace = Trace.from_arrays([0.0, 0.0], [12, 4], [2, 2])
    s = Scheduler(trace, PagedAllocator(2, 4), SchedulerConfig(chunked_prefill=False), 64)
    s.waiting.extend([0, 1])
    plan = s.schedule(5.0)
    assert plan.prefills == [(1, 4)] and s.admitted_s[1] == 5.0
    assert (s.status[0], s.reason[0], s.finished_s[0]) == ("rejected", "does not fit in the empty cache", 5.0)
    assert s.num_rejected == 1


# -- fast-forward queries and two-sample sequence ids ---------------------------------------------

def test_steady_decodes_and_advance_per_sequence():
    """One request, prompt 4, 6 outputs, after its prefill (1 token emitted): 6 - 1 - 1 = 4 more steps
    can run at once before its last token; advancing 4 steps leaves 8 slots computed, 5 tokens."""
    s = _sched([4], [6], PagedAllocator(10, 4))
    s.finish(s.schedule(0.0), 0.0)
    ids, steps, context = s.steady_decodes()
    assert (ids, steps, context) == ([0], 4, 4)
    s.advance(ids, steps)
    assert (s.computed_tokens(0), s.generated[0]) == (8, 5)


def test_steady_decodes_stop_before_a_sample_ends():
    """n = 2 with samples of 6 and 3 tokens: after the prefill the shorter sample's last token is 3 - 1
    steps away, so 1 step can run at once (its last token is a real step: it frees the sample)."""
    s = _sched([4], [6], PagedAllocator(10, 4), n=[2], per_sample=[[6, 3]])
    s.finish(s.schedule(0.0), 0.0)
    assert s.steady_decodes()[1] == 1


def test_advance_reports_memory_against_the_head_of_the_queue():
    """Contiguous first fit, 16 slots, peak reservations: A (prompt 4, 6 outputs) reserves 9; B (the
    same) needs 9 of the 7 left and waits. Advancing A 4 steps: each step's free 7 slots are stranded
    for B (external fragmentation 7, free 0)."""
    s = _sched([4, 4], [6, 6], ContiguousAllocator(16, 64, reserve="oracle", placement="first-fit"))
    s.finish(s.schedule(0.0), 0.0)
    ids, steps, _ = s.steady_decodes()
    mems = s.advance(ids, steps)
    assert steps == 4 and [(m.external_fragmentation, m.free) for m in mems] == [(7, 0)] * 4


def test_one_sequence_requests_keep_their_ids_beside_a_two_sample_request():
    """Requests 0 (n = 2, 1 output) and 1 (n = 1, 3 outputs): sequence ids are request x 2 (+ sample).
    After request 0 finishes at its prefill, request 1 decodes alone as sequence 2 (slots 5, 6)."""
    s = _sched([4, 4], [1, 3], PagedAllocator(10, 4), n=[2, 1])
    steps = _run(s)
    assert [(p.decodes, p.decode_context_tokens) for p, _, _ in steps] == [([], 0), ([1], 5), ([1], 6)]
    assert steps[0][0].allocated == [(0, 0), (2, 0)] and s.generated == [1, 3]
