"""Every summary metric pinned to a value worked out on paper, through the public `simulate()`.

Each test's docstring holds the derivation: the step-by-step timeline (who runs, KV slots per category)
and the arithmetic. Paged allocator with blocks of 4 slots; the last token's KV is never written, so a
request with prompt P and M outputs reaches P + M - 1 slots. Memory is logged per step after that
step's allocation. Together these tests fail on each of three bugs that once got through the suite:
TTFT counted from admission instead of arrival, a recomputed request re-prefilling only its prompt, and
memory fractions averaged per step instead of weighted by step time.
"""

import numpy as np
import pytest

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


class PrefillDecodeCost:
    """A step with any prefill takes `prefill_s` seconds, a decode-only step `decode_s`; no swaps."""

    def __init__(self, prefill_s: float, decode_s: float):
        self.prefill_s, self.decode_s = prefill_s, decode_s

    def step_time(self, prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens):
        return self.prefill_s if prefill_tokens else self.decode_s

    def swap_time(self, num_tokens, num_blocks=0):
        return 0.0


def trace_of(rows):
    """rows: (arrival_s, prompt_tokens, output_tokens)."""
    a, p, o = (np.array(col) for col in zip(*rows))
    return Trace.from_arrays(arrival_s=a.astype(float), prompt_tokens=p, output_tokens=o)


def paged(num_blocks, **sched):
    return SimConfig(DEP, CacheConfig(block_size=4, num_blocks=num_blocks), SchedulerConfig(**sched),
                     engine_profile="ideal")


def quantiles(p50, p90, p99, mean):
    return {"p50": pytest.approx(p50), "p90": pytest.approx(p90), "p99": pytest.approx(p99),
            "mean": pytest.approx(mean)}


def test_queued_request_with_longer_prefill_steps():
    """A (t=0, P=4, M=3) and B (t=0.5, P=4, M=2); 5 blocks = 20 slots; prefill steps 1 s, decode 0.5 s.

    step 1, 0 -> 1:    A prefills 4 slots (1 block, full). running 1, tokens 4, free 16.
                       B arrives at 0.5 and waits for the step to end.
    step 2, 1 -> 2:    A decodes (5 slots, 2 blocks; final 6: slot 6 reserved, 7-8 internal);
                       B admitted at 1, prefills 4 slots (1 block). running 2,
                       tokens 5 + 4 = 9, reserved 1, internal 2, free 20 - 12 = 8.
    step 3, 2 -> 2.5:  decode only. A 6 slots (final 6: slots 7-8 internal), B 5 slots in 2 blocks
                       (final 5: slots 6-8 internal). running 2, tokens 11, reserved 0, internal 5,
                       free 4. A (3 tokens) and B (2 tokens) finish at 2.5.
    TTFT: A 1 - 0 = 1, B 2 - 0.5 = 1.5 (from admission it would be 1): mean 1.25, p50 1.25,
          p90 1 + 0.9 x 0.5 = 1.45, p99 1.495.  E2E: A 2.5, B 2.0: mean 2.25, p90 2.45, p99 2.495.
    TPOT: A (2.5 - 1) / 2 = 0.75, B (2.5 - 2) / 1 = 0.5: mean 0.625.
    duration 2.5 s; throughput 2 / 2.5 = 0.8 req/s; 5 tokens / 2.5 = 2 tokens/s.
    mean batch (per step) (1 + 2 + 2) / 3 = 5/3; max 2.
    time-weighted over 1, 1, 0.5 s of 20 slots (total 50 slot-seconds):
      tokens (4 + 9 + 5.5) / 50 = 0.37 (the plain step mean would be 24/60 = 0.4);
      reserved 1/50 = 0.02; internal (2 + 2.5) / 50 = 0.09; free (16 + 8 + 2) / 50 = 0.52.
    peak allocated 16 of 20 = 0.8. Normalized latency (2.5/3 + 2/2) / 2 = 11/12.
    """
    res = simulate(trace_of([(0.0, 4, 3), (0.5, 4, 2)]), paged(5), cost=PrefillDecodeCost(1.0, 0.5))
    s = res.summary
    assert s["ttft_s"] == quantiles(1.25, 1.45, 1.495, 1.25)
    assert s["e2e_s"] == quantiles(2.25, 2.45, 2.495, 2.25)
    assert s["tpot_s"] == quantiles(0.625, 0.725, 0.7475, 0.625)
    assert s["duration_s"] == pytest.approx(2.5)
    assert s["throughput_rps"] == pytest.approx(0.8)
    assert s["throughput_tokens_per_s"] == pytest.approx(2.0)
    assert s["mean_batch_size"] == pytest.approx(5 / 3)
    assert s["max_batch_size"] == 2
    assert s["normalized_latency_s_per_token"] == pytest.approx(11 / 12)
    assert s["kv"]["mean_fraction"] == {"token_states": pytest.approx(0.37), "reserved": pytest.approx(0.02),
                                        "internal_fragmentation": pytest.approx(0.09),
                                        "external_fragmentation": 0.0, "free": pytest.approx(0.52)}
    assert s["kv"]["peak_allocated_fraction"] == pytest.approx(0.8)
    assert (s["requests_finished"], s["engine_steps"], s["preemptions"]) == (2, 3, 0)
    assert res.steps.duration_s.tolist() == [1.0, 1.0, 0.5]
    assert res.requests.admitted_s.tolist() == [0.0, 1.0]


def test_recompute_preemption_re_prefills_prompt_and_generated_tokens():
    """A and B (t=0, P=8, M=5, final 12 slots = 3 blocks each); 4 blocks = 16 slots; every step 1 s.

    step 1, 0-1: both prefill 8 slots (2 blocks each): tokens 16, free 0. First tokens at 1.
    step 2, 1-2: A needs a 3rd block; none free: B (admitted last) is preempted and freed, back to the
                 queue head with 1 token generated. A: 9 slots in 3 blocks (slots 10-12 reserved).
                 tokens 9, reserved 3, free 4. No admission in a step that preempted.
    steps 3-5:   A decodes to 10, 11, 12 slots (reserved 2, 1, 0; free 4). B needs 8 + 1 = 9 slots
                 = 3 blocks, only 1 free: it waits. A's 5th token at 5: A finishes.
    step 6, 5-6: B re-prefills prompt + its 1 generated token = 9 slots (3 blocks): tokens 9,
                 reserved 3, free 4 (re-prefilling only the prompt would hold 8 in 2 blocks, free 8).
    steps 7-9:   B decodes to 10, 11, 12 slots; its 5th token at 9.
    token_states per step 16, 9, 10, 11, 12, 9, 10, 11, 12 = 100 slot-steps of 9 x 16 = 144;
    reserved 0, 3, 2, 1, 0, 3, 2, 1, 0 = 12; free 0 + 8 x 4 = 32; peak allocated 16/16 = 1.
    TTFT: A 1, B 1 (its first token, before the preemption). E2E: A 5, B 9: mean 7, p90 8.6,
    p99 8.96. duration 9; throughput 2/9; mean batch (2 + 8 x 1) / 9 = 10/9.
    """
    res = simulate(trace_of([(0.0, 8, 5), (0.0, 8, 5)]), paged(4), cost=ConstantCost(1.0))
    s = res.summary
    assert res.steps.prefill_tokens.tolist() == [16, 0, 0, 0, 0, 9, 0, 0, 0]
    assert res.steps.token_states.tolist() == [16, 9, 10, 11, 12, 9, 10, 11, 12]
    assert res.steps.free.tolist() == [0] + [4] * 8
    assert s["kv"]["mean_fraction"] == {"token_states": pytest.approx(100 / 144),
                                        "reserved": pytest.approx(12 / 144), "internal_fragmentation": 0.0,
                                        "external_fragmentation": 0.0, "free": pytest.approx(32 / 144)}
    assert s["kv"]["peak_allocated_fraction"] == 1.0
    assert s["ttft_s"] == quantiles(1.0, 1.0, 1.0, 1.0)
    assert s["e2e_s"] == quantiles(7.0, 8.6, 8.96, 7.0)
    assert s["duration_s"] == 9.0
    assert s["throughput_rps"] == pytest.approx(2 / 9)
    assert s["mean_batch_size"] == pytest.approx(10 / 9)
    assert s["preemptions"] == 1 and res.requests.preemptions.tolist() == [0, 1]


def test_idle_gap_counts_in_duration_not_in_memory_averages():
    """A (t=0, P=4, M=2) and B (t=5, P=6, M=2); 10 blocks = 40 slots; every step 0.5 s.

    A: prefill 0-0.5 (4 slots), decode 0.5-1 (5 slots in 2 blocks, final 5: internal 3). Idle 1-5.
    B: prefill 5-5.5 (6 slots in 2 blocks, final 7: 1 reserved, 1 internal), decode 5.5-6 (7 slots:
    internal 1). duration 6 s (idle included): throughput 2/6; 2 x 2 tokens / 6 s.
    Memory averages over the 4 logged steps (idle time holds nothing and is not a step), equal
    weights: tokens (4 + 5 + 6 + 7) / 4 / 40 = 0.1375; reserved 1/160; internal (0 + 3 + 1 + 1)/160;
    peak allocated 8 / 40 = 0.2. TTFT 0.5 each; E2E 1 each; mean batch 1.
    """
    res = simulate(trace_of([(0.0, 4, 2), (5.0, 6, 2)]), paged(10), cost=ConstantCost(0.5))
    s = res.summary
    assert s["duration_s"] == 6.0
    assert s["throughput_rps"] == pytest.approx(1 / 3)
    assert s["throughput_tokens_per_s"] == pytest.approx(4 / 6)
    assert res.steps.time_s.tolist() == [0.0, 0.5, 5.0, 5.5]
    frac = s["kv"]["mean_fraction"]
    assert frac["token_states"] == pytest.approx(0.1375)
    assert frac["reserved"] == pytest.approx(1 / 160)
    assert frac["internal_fragmentation"] == pytest.approx(5 / 160)
    assert frac["free"] == pytest.approx(1 - (22 + 1 + 5) / 160)
    assert s["kv"]["peak_allocated_fraction"] == pytest.approx(0.2)
    assert s["ttft_s"] == quantiles(0.5, 0.5, 0.5, 0.5)
    assert s["e2e_s"] == quantiles(1.0, 1.0, 1.0, 1.0)
    assert s["mean_batch_size"] == 1.0


def test_rejected_and_empty_runs():
    """A request longer than the model's 2048 tokens is rejected on arrival and counts in no latency;
    a run where everything is rejected has no steps: duration 0, throughput 0, latencies None."""
    res = simulate(trace_of([(0.0, 2000, 100), (1.0, 4, 2)]), paged(10), cost=ConstantCost(0.5))
    s = res.summary
    assert (s["requests_total"], s["requests_finished"], s["requests_rejected"]) == (2, 1, 1)
    assert s["ttft_s"]["mean"] == 0.5 and s["e2e_s"]["mean"] == 1.0
    assert s["duration_s"] == 2.0 and s["throughput_rps"] == 0.5
    empty = simulate(trace_of([(0.0, 2000, 100)]), paged(10), cost=ConstantCost(0.5)).summary
    assert (empty["duration_s"], empty["throughput_rps"], empty["mean_batch_size"]) == (0.0, 0.0, 0.0)
    assert empty["ttft_s"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert empty["normalized_latency_s_per_token"] is None
    assert empty["kv"]["peak_allocated_fraction"] == 0.0 and empty["engine_steps"] == 0
    assert (empty["throughput_tokens_per_s"], empty["max_batch_size"]) == (0.0, 0)
    assert empty["kv"]["mean_fraction"] == dict.fromkeys(empty["kv"]["mean_fraction"], 0.0)
    assert empty["kv"]["sharing_saved_fraction"] == 0.0


def test_contiguous_first_fit_external_fragmentation():
    """Contiguous, exact (oracle) reservations of P + M - 1 slots, first fit, 10 slots; every step 1 s.
    A (P=2, M=2) reserves [0, 3), B (P=3, M=3) [3, 8), C (P=3, M=2, 4 slots) waits: all at t=0.

    step 1, 0-1: A 2 tokens + 1 reserved, B 3 + 2; hole [8, 10) of 2 < 4: external 2, free 0.
    step 2, 1-2: A 3 tokens, B 4 + 1 reserved; external 2. A finishes at 2, freeing [0, 3).
    step 3, 2-3: B 5 tokens; holes of 3 and 2 slots, both < 4: external 5, free 0. B finishes at 3.
    step 4, 3-4: C admitted at [0, 4): 3 tokens + 1 reserved; nobody waits: free 6.
    step 5, 4-5: C 4 tokens; free 6. C finishes at 5.
    Over 5 steps x 10 slots: tokens (5 + 7 + 5 + 3 + 4) / 50 = 0.48, reserved 5/50 = 0.1, external
    9/50 = 0.18, free 12/50 = 0.24; peak allocated (tokens + reserved + internal) 8/10 = 0.8.
    TTFT 1, 1, 4 (mean 2); E2E 2, 3, 5 (mean 10/3); mean batch (2 + 2 + 1 + 1 + 1)/5 = 1.4; 3/5 req/s.
    """
    cfg = SimConfig(DEP, CacheConfig(allocator="contiguous", block_size=1, num_blocks=10, reserve="oracle",
                                     placement="first-fit"), SchedulerConfig(), engine_profile="ideal")
    res = simulate(trace_of([(0.0, 2, 2), (0.0, 3, 3), (0.0, 3, 2)]), cfg, cost=ConstantCost(1.0))
    s = res.summary
    assert res.steps.external_fragmentation.tolist() == [2, 2, 5, 0, 0]
    assert s["kv"]["mean_fraction"] == {"token_states": pytest.approx(0.48), "reserved": pytest.approx(0.1),
                                        "internal_fragmentation": 0.0,
                                        "external_fragmentation": pytest.approx(0.18),
                                        "free": pytest.approx(0.24)}
    assert s["kv"]["peak_allocated_fraction"] == pytest.approx(0.8)
    assert s["ttft_s"]["mean"] == pytest.approx(2.0) and s["e2e_s"]["mean"] == pytest.approx(10 / 3)
    assert s["mean_batch_size"] == pytest.approx(1.4) and s["throughput_rps"] == pytest.approx(0.6)
    assert (s["kv"]["capacity_tokens"], s["kv"]["block_size"], s["kv"]["num_blocks"]) == (10, 1, 10)


def test_tables_number_steps_and_name_requests():
    """steps.csv counts steps from 0; requests.csv carries the trace's ids (1-based positions when absent);
    a one-token request has no TPOT (it decodes nothing) and counts one output token."""
    trace = Trace.from_arrays(arrival_s=np.array([0.0, 0.0]), prompt_tokens=np.array([4, 4]),
                              output_tokens=np.array([1, 3]))
    res = simulate(trace, paged(10), cost=ConstantCost(0.5))
    assert res.steps.step.tolist() == [0, 1, 2]
    assert res.requests.id.tolist() == ["1", "2"]
    assert res.requests.status.tolist() == ["finished", "finished"]
    assert res.summary["tpot_s"] == quantiles(0.5, 0.5, 0.5, 0.5)
    assert res.summary["throughput_tokens_per_s"] == pytest.approx(4 / 1.5)


def test_summary_keys_are_the_documented_ones():
    """DESIGN.md's `--json` keys (those this version computes), spelled exactly."""
    s = simulate(trace_of([(0.0, 4, 2)]), paged(10), cost=ConstantCost(0.5)).summary
    assert {"requests_total", "requests_finished", "requests_rejected", "duration_s", "throughput_rps",
            "throughput_tokens_per_s", "mean_batch_size", "max_batch_size", "normalized_latency_s_per_token",
            "ttft_s", "tpot_s", "e2e_s", "preemptions", "kv", "prefix_cache_hit_tokens", "sim_wall_s",
            "engine_steps"} <= set(s)
    assert set(s["kv"]) >= {"capacity_tokens", "block_size", "num_blocks", "mean_fraction",
                            "peak_allocated_fraction", "sharing_saved_fraction"}
    assert set(s["kv"]["mean_fraction"]) == {"token_states", "reserved", "internal_fragmentation",
                                             "external_fragmentation", "free"}
    assert s["sim_wall_s"] >= 0 and s["kv"]["sharing_saved_fraction"] == 0.0
