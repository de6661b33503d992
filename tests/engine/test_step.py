"""The step plan (kvsim/engine/step.py), hand-computed: what runs, every allocator call the scheduler made,
swaps, preemptions, finishes, memory during the step and its timing, without SimPy."""

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.cost.roofline import ConstantCost
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


def plans(trace, num_blocks, **sched):
    """Every request queued at 0; steps of 1 s plus 0.125 s per swapped token."""
    parts = build_run(trace, SimConfig(DEP, CacheConfig(block_size=4, num_blocks=num_blocks),
                                       SchedulerConfig(**sched), engine_profile="ideal"))
    for i in range(len(trace)):
        parts.scheduler.add(i, 0.0)
    stepper, now, out = Stepper(parts.scheduler, ConstantCost(1.0, 0.125)), 0.0, []
    while (plan := stepper.step(now, tables=True)) is not None:
        out.append(plan)
        now = plan.end_s
    return out


def test_two_samples_fork_the_prompt_and_copy_the_shared_last_block_on_write():
    # prompt 6 = blocks 0 (full) and 1 (2 of 4 slots); sample 2 (sequence 1) forks both
    p = plans(Trace.from_arrays([0.0], [6], [3], n=[2]), num_blocks=10)
    assert len(p) == 3 and [x.starts for x in p] == [[0.0], [1.0], [2.0]]
    assert (p[0].prefills, p[0].allocated, p[0].forked, p[0].copies) == ([(0, 6)], [(0, 0)], [(0, 1)], [])
    assert p[0].tables == {0: [0, 1], 1: [0, 1]} and p[0].memory[0].used_blocks == 2
    # the first decode writes into shared block 1: sequence 0 gets a copy in block 2
    assert (p[1].decodes, p[1].decode_seqs, p[1].copies) == ([0], 2, [(1, 2)])
    assert p[1].tables == {0: [0, 2], 1: [0, 1]} and p[1].memory[0].used_blocks == 3
    assert (p[2].copies, p[2].finished) == ([], [0])


def test_swap_out_and_back_in_with_its_pcie_time():
    # 4 blocks; two requests of prompt 4 fill them after one decode; the 5th decode needs a block
    p = plans(Trace.from_arrays([0.0, 0.0], [4, 4], [6, 6]), num_blocks=4, preemption="swap")
    assert [x.starts[0] for x in p] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 7.0]
    assert p[0].allocated == [(0, 0), (1, 0)] and p[1].tables == {0: [0, 2], 1: [1, 3]}
    out = p[5]                     # request 1 (admitted last) goes to CPU: 8 tokens, 1 + 8 x 0.125 s
    assert (out.preempted, out.swapped_out, out.freed, out.swap_tokens) == ([1], [1], [1], 8)
    assert out.swap_blocks == 2    # 8 tokens in blocks of 4: two copies (vLLM v0 copies block by block)
    assert out.durations == [2.0] and out.decodes == [0] and out.finished == [0]
    assert out.tables == {0: [0, 2, 3]}        # request 0 took the block request 1 gave back
    back = p[6]                    # back in 3 blocks, decoding its last token in the same step
    assert (back.swapped_in, back.allocated, back.decodes, back.finished) == ([1], [(1, 0)], [1], [1])
    assert back.swap_tokens == 8 and back.tables == {1: [1, 3, 2]} and back.swap_blocks == 2


def test_nothing_to_run_is_none():
    parts = build_run(Trace.from_arrays([0.0], [4], [2]), SimConfig(DEP, CacheConfig(num_blocks=8), engine_profile="ideal"))
    assert Stepper(parts.scheduler, ConstantCost(1.0)).step(0.0) is None      # nothing added yet


def test_static_batch_admits_only_what_its_peak_fits_in_paged_memory():
    """Static batches never preempt. Two requests of prompt 8 and 9 outputs peak at ceil(16 / 4) = 4
    blocks each; 6 blocks hold both prompts (2 + 2) but not both peaks (8), so the second waits for the
    first batch to end (it used to be admitted and the batch ran out of blocks mid-decode)."""
    p = plans(Trace.from_arrays([0.0, 0.0], [8, 8], [9, 9]), num_blocks=6, batching="static")
    assert [x.allocated for x in p if x.allocated] == [[(0, 0)], [(1, 0)]]
    assert p[0].prefills == [(0, 8)] and p[9].prefills == [(1, 8)] and len(p) == 18
    assert max(x.memory[0].used_blocks for x in p) == 4
