"""Engine profiles on golden cases computed by hand (constant kernel time C per step), and what
limited a run (`limited_by`, `compute_bound_fraction`, `swap`, `recomputed_tokens`) on constructed
cases whose answers are known."""

from dataclasses import replace

import numpy as np
import pytest

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.cost.v1_time import V1CostModel
from kvsim.cost.roofline import ConstantCost, CostModel
from kvsim.cost.profiles import PROFILES
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

C = 1.0
DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
NO_CPU = {name: replace(p, cpu_step_s=0.0, cpu_seq_s=0.0) for name, p in PROFILES.items()}


def trace_of(rows, n=None):
    a, p, o = (np.array(col) for col in zip(*rows))
    return Trace.from_arrays(a.astype(float), p, o, n=1 if n is None else n)


def run(rows, profile, n=None, cache=None, cost=ConstantCost(C), **sched):
    cfg = SimConfig(DEP, CacheConfig(**(cache or {"block_size": 4, "num_blocks": 100})),
                    SchedulerConfig(**sched), engine_profile=profile)
    return simulate(trace_of(rows, n), cfg, cost=cost)


def test_a_prompt_arriving_mid_decode_pauses_the_batch_under_vllm_2023_only():
    # A: prompt 10, 5 outputs from t=0; B: prompt 10, 3 outputs, arrives at 1.5 (during A's 2nd step)
    rows = [(0.0, 10, 5), (1.5, 10, 3)]
    old, new = run(rows, NO_CPU["vllm-2023"]), run(rows, NO_CPU["vllm-v1"])
    # vllm-2023: [A prefill] [A] [B prefill only: A waits] [A B] [A B: B done] [A: done at 6]
    assert old.steps.prefill_tokens.tolist() == [10, 0, 10, 0, 0, 0]
    assert old.steps.decode_tokens.tolist() == [0, 1, 0, 2, 2, 1]
    assert old.requests.finished_s.tolist() == [6 * C, 5 * C]
    # vllm-v1: B's prefill rides along A's decode, so A never waits; but under async scheduling step 3 was
    # scheduled when step 2 started (t = 1), before B arrived: B is admitted by step 4 (vllm PR #19970)
    # (and B, finished by step 6, is held through one more step that plans nothing and takes no time)
    assert new.steps.prefill_tokens.tolist() == [10, 0, 0, 10, 0, 0, 0]
    assert new.steps.decode_tokens.tolist() == [0, 1, 1, 1, 2, 1, 0]
    assert new.steps.duration_s.tolist()[-1] == 0.0
    assert new.requests.finished_s.tolist() == [5 * C, 6 * C]
    assert old.requests.first_token_s.tolist() == [C, 3 * C] and new.requests.first_token_s.tolist() == [C, 4 * C]
    assert old.summary["engine_profile"] == "vllm-2023" and new.summary["engine_profile"] == "vllm-v1"


def test_cpu_time_is_fixed_plus_per_sequence_per_step():
    profile = replace(NO_CPU["vllm-v1"], cpu_step_s=0.5, cpu_seq_s=0.25)
    one = run([(0.0, 10, 3)], profile)            # 3 steps of 1 + 0.5 + 0.25 x 1 sequence
    assert one.requests.finished_s.tolist() == [5.25] and one.requests.first_token_s.tolist() == [1.75]
    two = run([(0.0, 10, 3), (0.0, 10, 3)], profile)   # 3 steps of 1 + 0.5 + 0.25 x 2
    assert two.requests.finished_s.tolist() == [6.0, 6.0]
    # the shipped vllm-v1: its 0.241 ms + 29.4 us per sequence are overlapped with the GPU by async
    # scheduling inside its own time model (kvsim.cost.v1_time); a replaced cost model (here a constant)
    # sees only the gap left between steps, 0.16 ms (vllm PR #11133)
    real = run([(0.0, 10, 3)], "vllm-v1")
    assert real.requests.finished_s.tolist() == [pytest.approx(3 * (C + 1.6e-4))]
    ideal = run([(0.0, 10, 3)], "ideal")           # kernels only: the constant cost alone
    assert ideal.requests.finished_s.tolist() == [3 * C]


def test_profiles_set_the_kernel_model_paged_penalty_and_step_overhead():
    trace = trace_of([(0.0, 100, 20)])
    cfg = SimConfig(DEP, CacheConfig(kv_gib=1), SchedulerConfig(), engine_profile="ideal")
    steps = {p: simulate(trace, replace(cfg, engine_profile=p)).steps.duration_s.to_numpy() for p in PROFILES}
    # vllm-v1: its own time model (CUDA graphs; CPU work 0.241 ms + 29.4 us x sequences overlapped with
    # the kernels), no paged penalty, then the 0.16 ms gap between steps
    v1 = V1CostModel(DEP, 16, max_num_seqs=256, max_batched_tokens=8192, cpu_step_s=2.41e-4, cpu_seq_s=2.94e-5)
    assert steps["vllm-v1"][1] == pytest.approx(max(v1.step_time(0, 0, 1, 101), 2.41e-4 + 2.94e-5) + 1.6e-4)
    penalised = CostModel(DEP, 16, paged=True, step_overhead_s=0.0)
    assert steps["vllm-2023"][1] == pytest.approx(penalised.step_time(0, 0, 1, 101) + 1.20e-3 + 1.00e-4)
    assert steps["ideal"][1] == pytest.approx(penalised.step_time(0, 0, 1, 101) + 2e-3)


def test_vllm_2023_swaps_multi_sequence_requests_and_recomputes_single_ones():
    # 14 blocks of 4: R0 and R1 (each prompt 8, 20 outputs) outgrow them; R1, admitted last, goes
    cache = {"block_size": 4, "num_blocks": 14}
    multi = run([(0.0, 8, 20), (0.0, 8, 20)], NO_CPU["vllm-2023"], n=[1, 2], cache=cache)
    swap = multi.summary["swap"]
    assert swap["swap_outs"] >= 1 and swap["swap_ins"] == swap["swap_outs"]
    assert multi.summary["recomputed_tokens"] == 0 and swap["fallbacks_to_recompute"] == 0
    moved = multi.steps.prefill_tokens.sum()   # (no re-prefill: swapping keeps progress)
    assert moved == 8 + 8
    assert swap["bytes"] % (800 * 1024) == 0 and swap["bytes"] > 0
    single = run([(0.0, 8, 20), (0.0, 8, 20)], NO_CPU["vllm-2023"], n=[2, 1], cache=cache)
    assert single.summary["swap"]["swap_outs"] == 0 and single.summary["recomputed_tokens"] > 0
    ideal = run([(0.0, 8, 20), (0.0, 8, 20)], NO_CPU["ideal"], n=[1, 2], cache=cache)
    assert ideal.summary["swap"]["swap_outs"] == 0 and ideal.summary["recomputed_tokens"] > 0
    full = run([(0.0, 8, 20), (0.0, 8, 20)], NO_CPU["vllm-2023"], n=[1, 2], cache={**cache, "swap_gib": 0})
    assert full.summary["swap"]["fallbacks_to_recompute"] >= 1 and full.summary["recomputed_tokens"] > 0


def test_recompute_counts_the_tokens_computed_again():
    # 6 blocks of 4 = 24 slots; two requests (prompt 4, 17 outputs) each grow to 20 slots
    res = run([(0.0, 4, 17), (0.0, 4, 17)], NO_CPU["ideal"], cache={"block_size": 4, "num_blocks": 6})
    assert res.summary["preemptions"] == 1
    # B, preempted when the 6 blocks are full after 8 decode steps (A and B hold 12 slots each), had
    # computed 4 + 8 = 12 tokens; its re-prefill computes those again plus its pending 9th token
    assert res.summary["recomputed_tokens"] == 12
    assert res.steps.prefill_tokens.sum() == 4 + 4 + 12 + 1


@pytest.mark.parametrize("sched, cache, limit", [
    ({"max_num_seqs": 1}, None, "max_num_seqs"),
    ({}, {"allocator": "contiguous", "reserve": "oracle", "block_size": 4, "num_blocks": 5}, "kv_memory"),
    ({"max_batched_tokens": 10}, None, "token_budget"),
])
def test_limited_by_names_what_held_the_waiting_request(sched, cache, limit):
    # two requests (prompt 10, 3 outputs) at t=0; only one can run: the other waits 3 of the 6 steps
    res = run([(0.0, 10, 3), (0.0, 10, 3)], NO_CPU["ideal"], cache=cache, **sched)
    assert res.requests.finished_s.tolist() == [3 * C, 6 * C]
    expected = {"kv_memory": 0.0, "max_num_seqs": 0.0, "token_budget": 0.0, limit: 0.5}
    assert res.summary["limited_by"] == expected
    assert res.steps.limited_by.tolist() == [["", "kv_memory", "max_num_seqs", "token_budget"].index(limit)] * 3 + [0] * 3


def test_compute_bound_fraction_is_the_prefill_share_of_a_long_prompt():
    res = run([(0.0, 2000, 2)], NO_CPU["vllm-v1"], cache={"kv_gib": 4}, cost=None)
    # (async scheduling: the finished request is held through an empty step of no time)
    prefill, decode, held = res.steps.duration_s.tolist()
    assert held == 0.0
    assert res.steps.compute_bound.tolist() == [1, 0, 0]
    assert res.summary["compute_bound_fraction"] == pytest.approx(prefill / (prefill + decode))
    assert res.summary["limited_by"] == {"kv_memory": 0.0, "max_num_seqs": 0.0, "token_budget": 0.0}


def test_chunked_prefill_contradicting_vllm_2023_is_refused():
    with pytest.raises(ValueError, match="--chunked-prefill: the vllm-2023 engine profile runs each prompt whole"):
        run([(0.0, 10, 3)], "vllm-2023", chunked_prefill=True)
