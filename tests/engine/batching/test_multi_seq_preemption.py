"""Preempting requests with several sequences (n > 1): recompute re-prefills the prompt once and each
sample's own outputs (so samples share only the prompt again, never outputs they did not share), or
`swap_multi_seq` swaps them out even under recompute (vLLM 2023)."""

from dataclasses import replace

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

# B: prompt 8, 8 outputs (peaks at 15 tokens = 4 blocks of 4); A, admitted after B: prompt 8, n = 2,
# 4 outputs (peaks at 11 tokens: 2 shared prompt blocks + 1 own block per sample = 4 blocks).
TRACE = Trace.from_arrays([0.0, 0.0], [8, 8], [8, 4], n=[1, 2])


def _run(num_blocks: int, **sched):
    """(Prefix caching off, as these hand-worked steps assume: with it, a re-admitted request would hit
    its own earlier prompt blocks.)"""
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=4, num_blocks=num_blocks, swap_gib=1.0, prefix_caching=False),
                    replace(SchedulerConfig(), **sched))
    parts = build_run(TRACE, cfg)
    s = parts.scheduler
    s.add(0, 0.0)
    s.add(1, 0.0)
    plans, tables = [], []
    t = 0.0
    while not s.done():
        plan = s.schedule(t)
        plans.append(plan)
        if plan.prefills and plan.prefills[-1][0] == 1 and s.preemptions[1]:
            tables.append([parts.allocator.block_table(q) for q in s.seq_ids(1)])
        parts.allocator.check_invariants()
        s.finish(plan, t)
        t += 1.0
    return s, plans, tables


def test_recompute_re_prefills_the_prompt_once_and_each_samples_outputs():
    # 6 blocks: step 0 B and A take 2 each; step 1 (9th tokens) B takes its 3rd, A's samples one each:
    # 7 > 6, so A is preempted with 1 output per sample. Re-admitted after B: 8 prompt tokens once and
    # 1 output per sample = 10 tokens computed; the samples share the 2 prompt blocks, not the third.
    s, plans, tables = _run(6)
    assert s.preemptions == [0, 1]
    readmit = next(p for p in plans[1:] if p.prefills and p.prefills[0][0] == 1)
    assert readmit.prefills == [(1, 8 + 2 * 1)]
    (a, b), = tables
    assert a[:2] == b[:2] and a[2] != b[2] and len(a) == len(b) == 3
    assert s.generated == [8, 4] and s.num_finished == 2


def test_swap_multi_seq_swaps_a_multi_sequence_request_under_recompute():
    s, plans, _ = _run(6, swap_multi_seq=True)
    assert s.preemptions == [0, 1]
    assert plans[1].swap_tokens == 2 * 8            # both samples' 8 written slots go out...
    assert not any(p.prefills and p.prefills[0][0] == 1 for p in plans[1:])   # ...and come back
    assert s.generated == [8, 4] and s.num_finished == 2
