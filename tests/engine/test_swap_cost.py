"""Swap transfers, worked by hand: bytes over PCIe plus a fixed cost per copy call (vLLM v0 copies a
swapped request block by block, keys and values of each layer apart), and vLLM v0's rule that no new
request is admitted while any sequence is swapped out."""

import pytest

from kvsim.cost.roofline import SWAP_COPY_FIXED_S, ConstantCost, CostModel
from kvsim.engine.build import build_run
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.step import Stepper
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


def test_swap_time_is_bytes_over_pcie_plus_two_calls_per_layer_per_block():
    cost = CostModel(DEP, 16, paged=True)
    # OPT-13B: 2 x 40 layers x 5120 x 2 bytes = 819,200 bytes per token; A100 PCIe 25e9 bytes/s
    assert SWAP_COPY_FIXED_S == 7e-6
    assert cost.swap_time(1000) == pytest.approx(1000 * 819_200 / 25e9)                  # 32.8 ms
    # 1000 tokens in 63 blocks of 16: 63 x 80 calls x 7 us = 35.3 ms more
    assert cost.swap_time(1000, 63) == pytest.approx(0.032768 + 63 * 80 * 7e-6)
    # block 1 pays a call per token: 1000 x 80 x 7 us = 0.56 s, 17x the bytes' time
    assert cost.swap_time(1000, 1000) == pytest.approx(0.032768 + 0.56)
    assert ConstantCost(1.0, 0.5).swap_time(4, 99) == 2.0          # golden-test cost: per token only


def _run(trace, num_blocks, allocator="paged", late=()):
    """Steps of 1 s plus 0.125 s per swapped token; requests in `late` arrive after the first swap-out."""
    parts = build_run(trace, SimConfig(DEP, CacheConfig(block_size=4, num_blocks=num_blocks, allocator=allocator),
                                       SchedulerConfig(preemption="swap"), engine_profile="ideal"))
    for i in range(len(trace)):
        if i not in late:
            parts.scheduler.add(i, 0.0)
    stepper, now, out = Stepper(parts.scheduler, ConstantCost(1.0, 0.125)), 0.0, []
    while (plan := stepper.step(now, tables=True)) is not None:
        out.append(plan)
        now = plan.end_s
        if plan.swapped_out and late:
            for i in late:
                parts.scheduler.add(i, now)
            late = ()
    return out


def test_no_request_is_admitted_while_one_is_swapped_out():
    # 4 blocks of 4. R0 and R1 (prompt 4, 6 outputs) fill them; at the 5th decode R1 (8 tokens) goes to
    # CPU and R0 finishes. R2 (prompt 4: one block) arrives then. Next step: R1 comes back into 3 of the
    # 4 free blocks; R2 would fit in the 4th but waits, because R1 was swapped out when the step began.
    trace = Trace.from_arrays([0.0, 0.0, 0.0], [4, 4, 4], [6, 6, 2])
    p = _run(trace, num_blocks=4, late=(2,))
    k = next(j for j, x in enumerate(p) if x.swapped_out)
    assert p[k].swapped_out == [1] and p[k].finished == [0]
    assert p[k + 1].swapped_in == [1] and p[k + 1].prefills == []
    assert [r for r, _ in p[k + 2].prefills] == [2]


def test_contiguous_memory_swaps_a_sequence_in_one_piece():
    parts = build_run(Trace.from_arrays([0.0], [4], [6]), SimConfig(
        DEP, CacheConfig(allocator="contiguous", num_blocks=40), SchedulerConfig(), engine_profile="ideal"))
    assert parts.scheduler.swap_piece_tokens == 0 and parts.scheduler._swap_pieces(1000) == 1
    paged = build_run(Trace.from_arrays([0.0], [4], [6]), SimConfig(
        DEP, CacheConfig(block_size=4, num_blocks=4), SchedulerConfig(), engine_profile="ideal"))
    assert paged.scheduler._swap_pieces(9) == 3 and paged.scheduler._swap_pieces(8) == 2
