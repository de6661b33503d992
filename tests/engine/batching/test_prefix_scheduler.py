"""Prefix caching through the scheduler, hand-computed: hits at first admission count (not those of
recomputation after preemption), the hit rate is hit tokens / prompt tokens, blocks registered at
scheduling time serve a request admitted later in the same step."""

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace


def _run(trace: Trace, num_blocks: int, **sched) -> dict:
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=4, num_blocks=num_blocks, prefix_caching=True),
                    SchedulerConfig(**sched), engine_profile="ideal")
    return simulate(trace, cfg, cost=ConstantCost(0.01)).summary


def test_same_step_hit_and_hit_rate():
    # A and B share an 8-token prompt (2 blocks); B is admitted in A's step and hits floor(7/4) = 1 block
    trace = Trace.from_arrays([0.0, 0.0], [8, 8], [3, 2], block_hashes=[[1, 2], [1, 2]], hash_block_size=4)
    s = _run(trace, 64)
    assert (s["prefix_cache_hit_tokens"], s["prefix_cache_hit_rate"]) == (4, 4 / 16)


def test_recomputation_hits_are_not_counted_as_prefix_hits():
    # 5 blocks of 4: A (prompt 8, 3 outputs) takes 2 blocks, B (prompt 9, 3 outputs) 3. Step 1: A's
    # 9th token needs a 3rd block, so B (admitted last) is preempted: its two full blocks stay cached
    # as its own, its partial one is reused by A. B's recompute (9 + 1 tokens) hits both: it prefills
    # 2 tokens, a recomputation hit that is not counted as a prefix-cache hit.
    trace = Trace.from_arrays([0.0, 0.0], [8, 9], [3, 3])
    cfg = SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb"), 1),
                    CacheConfig(block_size=4, num_blocks=5, prefix_caching=True),
                    engine_profile="ideal")
    res = simulate(trace, cfg, cost=ConstantCost(0.01))
    assert res.summary["preemptions"] == 1
    assert res.steps["prefill_tokens"].tolist() == [17, 0, 0, 2, 0]
    assert res.summary["prefix_cache_hit_tokens"] == 0 and res.summary["prefix_cache_hit_rate"] == 0.0
