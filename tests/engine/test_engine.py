"""Golden runs with a constant step cost c, computed by hand, plus whole-trace properties."""

import numpy as np
import pytest

from kvsim.cost.roofline import ConstantCost
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

C = 0.5  # seconds per step


def trace_of(rows, n=None):
    """rows: (arrival_s, prompt_tokens, output_tokens)."""
    a, p, o = (np.array(col) for col in zip(*rows))
    return Trace.from_arrays(arrival_s=a.astype(float), prompt_tokens=p, output_tokens=o,
                             n=1 if n is None else n)


def config(allocator="paged", block_size=4, num_blocks=None, kv_gib=None, reserve="oracle", **sched):
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    cache = CacheConfig(allocator=allocator, block_size=block_size, num_blocks=num_blocks, kv_gib=kv_gib,
                        reserve=reserve, placement="first-fit")
    return SimConfig(dep, cache, SchedulerConfig(**sched), engine_profile="ideal")   # goldens: no CPU time


def run(trace, cfg):
    return simulate(trace, cfg, cost=ConstantCost(C))


def test_single_request_finishes_after_one_prefill_and_m_minus_1_decodes():
    res = run(trace_of([(0.0, 10, 5)]), config(num_blocks=100))
    req = res.requests.iloc[0]
    assert (req.first_token_s, req.finished_s) == (C, 5 * C)
    assert res.summary["tpot_s"]["mean"] == pytest.approx(C)
    assert res.summary["engine_steps"] == 5
    assert res.summary["normalized_latency_s_per_token"] == pytest.approx(5 * C / 5)


def test_single_request_arriving_later_starts_at_its_arrival():
    res = run(trace_of([(3.0, 10, 2)]), config(num_blocks=100))
    assert res.requests.finished_s.tolist() == [3.0 + 2 * C]


def test_two_requests_that_fit_run_together():
    res = run(trace_of([(0.0, 10, 3), (0.0, 10, 5)]), config(num_blocks=100))
    assert res.requests.finished_s.tolist() == [3 * C, 5 * C]
    assert res.summary["max_batch_size"] == 2


def test_two_requests_that_do_not_fit_run_one_after_the_other():
    # contiguous oracle reserves P + M - 1 = 14 slots each; 20 slots hold only one
    res = run(trace_of([(0.0, 10, 5), (0.0, 10, 5)]), config("contiguous", num_blocks=5))   # 5 x 4 = 20 slots
    assert res.requests.finished_s.tolist() == [5 * C, 10 * C]
    assert res.requests.admitted_s.tolist() == [0.0, 5 * C]
    assert res.summary["max_batch_size"] == 1


def test_preemption_by_recompute_golden():
    # 4 blocks of 4 slots; both prompts (8 slots = 2 blocks) fit, but not their growth.
    res = run(trace_of([(0.0, 8, 5), (0.0, 8, 5)]), config(num_blocks=4))
    a, b = res.requests.iloc[0], res.requests.iloc[1]
    assert (a.first_token_s, a.finished_s, a.preemptions) == (C, 5 * C, 0)
    # B emitted its first token at C, was preempted at step 2, re-prefilled 9 tokens at 5C
    assert (b.first_token_s, b.finished_s, b.preemptions) == (C, 9 * C, 1)
    assert res.summary["preemptions"] == 1


def test_preemption_by_swap_keeps_progress_and_charges_pcie_time():
    cfg = config(num_blocks=4, preemption="swap")
    res = simulate(trace_of([(0.0, 8, 5), (0.0, 8, 5)]), cfg, cost=ConstantCost(C, swap_s_per_token=0.01))
    b = res.requests.iloc[1]
    assert b.preemptions == 1
    # out: 8 slots at step 2 (+0.08 s); back in after A finishes (+0.08 s), then 3 decodes
    assert b.finished_s == pytest.approx(9 * C + 0.16)


def test_paged_and_contiguous_oracle_agree_when_memory_is_plentiful():
    rng = np.random.default_rng(1)
    rows = sorted(zip(rng.uniform(0, 20, 40), rng.integers(1, 200, 40), rng.integers(1, 100, 40)))
    tr = trace_of(rows)
    paged = run(tr, config(num_blocks=10_000))
    contig = run(tr, config("contiguous", num_blocks=40_000))
    assert paged.requests.finished_s.tolist() == contig.requests.finished_s.tolist()
    assert paged.summary["preemptions"] == contig.summary["preemptions"] == 0


def test_memory_categories_sum_to_capacity_every_step():
    rng = np.random.default_rng(2)
    rows = sorted(zip(rng.uniform(0, 5, 60), rng.integers(1, 300, 60), rng.integers(1, 300, 60)))
    for cfg in (config(num_blocks=300), config("contiguous", num_blocks=300, reserve="pow2"),
                config("contiguous", num_blocks=600, reserve="max")):
        res = run(trace_of(rows), cfg)
        s = res.steps
        total = s.token_states + s.reserved + s.internal_fragmentation + s.external_fragmentation + s.free
        assert (total == res.summary["kv"]["capacity_tokens"]).all()
        assert sum(res.summary["kv"]["mean_fraction"].values()) == pytest.approx(1.0)
        assert res.summary["requests_finished"] == 60


def test_too_long_requests_are_rejected_with_a_reason_and_the_run_goes_on():
    res = run(trace_of([(0.0, 2000, 100), (0.0, 10, 3), (1.0, 300, 10)]), config(num_blocks=50))
    status = res.requests.status.tolist()
    assert status == ["rejected", "finished", "rejected"]
    assert "exceeds the model's maximum length 2048" in res.requests.reason[0]
    assert "more than the whole cache" in res.requests.reason[2]
    assert res.summary["requests_rejected"] == 2


def test_a_contiguous_reservation_larger_than_the_cache_is_rejected_on_arrival():
    # 1000 slots; B's pow2 reservation is 500 + 512 = 1012 slots although it peaks at 799 tokens:
    # rejected when it arrives, so C (behind it in the queue) runs beside A instead of waiting
    rows = [(0.0, 10, 3), (0.0, 500, 300), (0.0, 10, 3)]
    res = run(trace_of(rows), config("contiguous", num_blocks=250, reserve="pow2"))
    assert res.requests.status.tolist() == ["finished", "rejected", "finished"]
    assert res.requests.reason[1] == "needs 1012 KV slots at its peak, more than the whole cache (1000)"
    assert res.requests.finished_s.tolist() == [3 * C, 0.0, 3 * C]


def test_parallel_samples_share_the_prompt():
    """4 samples of a 64-token prompt share its 16 blocks; decode step k (1..19) gives each sample
    ceil(k/4) blocks of its own. Used blocks 16 + 4 ceil(k/4), unshared 4 (16 + ceil(k/4)): 48 saved
    at every step. Over the 20 steps the unshared blocks sum to 64 x 20 + 4 x (4x1 + 4x2 + 4x3 + 4x4 +
    3x5 = 55) = 1500, mean 75: saved fraction 48 / 75 = 0.64."""
    res = run(trace_of([(0.0, 64, 20)], n=[4]), config(num_blocks=200))
    assert res.requests.finished_s.tolist() == [20 * C]
    assert res.steps.used_blocks.tolist()[:6] == [16, 20, 20, 20, 20, 24]
    assert res.summary["kv"]["sharing_saved_fraction"] == pytest.approx(0.64)
    assert res.summary["throughput_tokens_per_s"] == pytest.approx(4 * 20 / (20 * C))


def test_static_batching_waits_for_the_longest_request():
    """Continuous: the third request (arriving mid-step 1) joins at step 2 (first token at 2C) and
    finishes at 3C, the first at 2C, the second at 6C. Static: the first batch holds until its longest
    request ends at 6C (so the first request's finish is reported then), the third runs 6C-8C."""
    rows = [(0.0, 10, 2), (0.0, 10, 6), (0.25, 10, 2)]
    res = run(trace_of(rows), config("contiguous", num_blocks=200))
    assert res.requests.finished_s.tolist() == [2 * C, 6 * C, 3 * C]
    static = run(trace_of(rows), config("contiguous", num_blocks=200, batching="static"))
    assert static.requests.finished_s.tolist() == [6 * C, 6 * C, 8 * C]
    assert static.requests.first_token_s.tolist() == [C, C, 7 * C]


def test_chunked_prefill_splits_a_long_prompt_over_steps():
    res = run(trace_of([(0.0, 100, 3)]), config(num_blocks=100, max_batched_tokens=40, chunked_prefill=True))
    assert res.requests.first_token_s.tolist() == [3 * C]      # 40 + 40 + 20 tokens
    assert res.requests.finished_s.tolist() == [5 * C]


def test_contiguous_max_opt13b_12gib_never_holds_more_than_7():
    rng = np.random.default_rng(3)
    rows = sorted(zip(rng.uniform(0, 30, 200), rng.integers(10, 400, 200), rng.integers(10, 400, 200)))
    res = run(trace_of(rows), config("contiguous", kv_gib=12, reserve="max", block_size=16))
    assert res.summary["kv"]["capacity_tokens"] == 15728
    assert res.summary["max_batch_size"] == 7


def test_max_num_seqs_limits_the_batch():
    rows = [(0.0, 10, 6)] * 5
    res = run(trace_of(rows), config(num_blocks=1000, max_num_seqs=2))
    assert res.summary["max_batch_size"] == 2
    assert res.requests.finished_s.tolist() == [6 * C, 6 * C, 12 * C, 12 * C, 18 * C]


def test_max_batched_tokens_holds_back_prefills():
    # 30-token prompts, 50-token budget: one prefill per step
    res = run(trace_of([(0.0, 30, 3)] * 3), config(num_blocks=1000, max_batched_tokens=50))
    assert res.requests.first_token_s.tolist() == [C, 2 * C, 3 * C]
