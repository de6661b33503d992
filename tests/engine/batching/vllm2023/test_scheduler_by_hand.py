"""vLLM 0.1.4's policy (kvsim/engine/batching/vllm2023/scheduler.py) on tiny pools, worked out by hand from
vllm/core/scheduler.py and block_manager.py of 0.1.4. Blocks of 4 slots; steps at t = 0, 1, 2, ..."""

from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.engine.config import SchedulerConfig
from kvsim.engine.batching.request_state import REJECTED
from kvsim.engine.batching.vllm2023.scheduler import SchedulerV0
from kvsim.trace.table import Trace


def _sched(prompts, outputs, num_blocks, **cfg) -> SchedulerV0:
    trace = Trace.from_arrays([0.0] * len(prompts), prompts, outputs)
    cfg = {"max_num_seqs": 256, "max_batched_tokens": 2560, "separate_prefill": True, "swap_multi_seq": True, **cfg}
    s = SchedulerV0(trace, PagedAllocator(num_blocks, 4), SchedulerConfig(**cfg), max_seq_len=2048)
    for i in range(len(prompts)):
        s.add(i, 0.0)
    return s


def _steps(s: SchedulerV0, limit: int) -> list[tuple]:
    out = []
    for t in range(limit):
        plan = s.schedule(float(t))
        if plan is None:
            break
        used = s.alloc.stats().used_blocks
        s.finish(plan, float(t))
        out.append((plan.prefills, plan.decodes, plan.preempted, used))
    return out


def test_every_running_sequence_needs_a_free_block_so_preemption_starts_when_the_list_is_empty():
    """4 blocks, watermark int(0.04) = 0; two prompts of 4 tokens (one block each), 10 outputs. Step 1's
    decode takes a block each (tokens 5): none free. At step 2 R0 needs no new block (token 6) but
    `can_append_slot` wants one free block, so R1 (the later arrival) is recomputed; step 3 re-admits it
    with its 6 tokens (2 blocks, leaving 0 >= watermark 0) in a prompt step, and step 4 repeats step 2."""
    s = _sched([4, 4], [10, 10], num_blocks=4)
    assert s.watermark_blocks == 0
    assert _steps(s, 6) == [
        ([(0, 4), (1, 4)], [], [], 2),
        ([], [0, 1], [], 4),
        ([], [0], [1], 2),
        ([(1, 6)], [], [], 4),
        ([], [0], [1], 2),
        ([(1, 7)], [], [], 4),
    ]


def test_admission_keeps_one_percent_of_the_blocks_free():
    """200 blocks: watermark 2. A 792-token prompt (198 blocks) leaves 2 free and is admitted; a
    796-token one (199 blocks) would leave 1, so it never fits, even in the empty cache (rejected)."""
    s = _sched([792], [1], num_blocks=200)
    assert s.watermark_blocks == 2
    assert _steps(s, 2) == [([(0, 792)], [], [], 198)]
    s = _sched([796], [1], num_blocks=200)
    assert _steps(s, 2) == [] and s.status[0] == REJECTED


def test_a_prompt_longer_than_the_budget_is_dropped_at_the_head_and_ends_that_steps_admissions():
    """Budget 16: R1's 20-token prompt is dropped when it reaches the head (0.1.4 `break`s there), so
    R0 runs alone in step 0's prompt step and R2 waits for step 1."""
    s = _sched([8, 20, 8], [2, 2, 2], num_blocks=40, max_batched_tokens=16)
    rows = _steps(s, 4)
    assert [r[0] for r in rows[:2]] == [[(0, 8)], [(2, 8)]]
    assert s.status[1] == REJECTED and s.ignored == 1
