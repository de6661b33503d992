"""Parallel samples on the lazy decode path (issue 19 item 1): requests with n > 1 samples (forks sharing
the prompt's blocks; each fork copies the shared partly filled last block in its first tick, as
`append_each` copies it) step lazily, and every plan (copy-on-write pairs included), block table, the
prefix cache and every request's state equal the per-sequence path after each step, under recompute
and swap preemption, chunked prefill and prefix caching. Beams that die (reforks) and samples of
different lengths keep the per-sequence path."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kvsim.engine.build import build_run
from kvsim.cost.profiles import get_profile
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace

from tests.engine_loop import engine_steps
from tests.quick_examples import examples
from tests.engine.batching.test_lazy_decode import _side_by_side

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


def _trace(seed: int, burst: bool, samples: int, num: int = 40) -> Trace:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(1, 90, num)
    groups = rng.choice(["a", "b", None], num)
    shared = np.where(groups == None, 0, np.minimum(prompts, rng.integers(1, 60, num)))  # noqa: E711
    return Trace.from_arrays(np.sort(rng.uniform(0, 0.5 if burst else 4, num)), prompts,
                             rng.integers(1, 120, num), n=rng.choice([1, samples], num),
                             prefix_group=groups, prefix_tokens=shared)


@settings(**examples(60), deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_blocks=st.integers(30, 250), samples=st.sampled_from([2, 3, 4]),
       swap=st.booleans(), prefix=st.booleans(), burst=st.booleans(), budget=st.sampled_from([8, 64, 8192]),
       profile=st.sampled_from(["vllm-v1", "vllm-v1", "ideal", "vllm-2023"]))
def test_lazy_samples_equal_per_sequence_steps(seed, num_blocks, samples, swap, prefix, burst, budget, profile):
    sched = {"preemption": "swap" if swap else "recompute", "max_batched_tokens": budget}
    if profile == "vllm-2023":
        sched["chunked_prefill"] = False
        # (on paged memory vllm-2023 runs vLLM 0.1.4's own policy, which has no lazy path: the engine's
        # own separate-prefill policy is what ticks here)
        profile = replace(get_profile("vllm-2023"), policy="kvsim")
        sched["max_batched_tokens"] = 8192
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=num_blocks, swap_gib=0.05 if swap else 0,
                                     prefix_caching=prefix),
                    SchedulerConfig(**sched), engine_profile=profile)
    _side_by_side(_trace(seed, burst, samples), cfg)


@pytest.mark.parametrize("prefix", [False, True])
def test_samples_run_lazily_and_copy_their_shared_block_in_the_first_tick(prefix):
    """Two requests of 4 samples, prompts of 12 and 20 tokens in blocks of 8: each fork copies its
    shared, partly filled last prompt block at its first decode step (3 copies per request: the fourth
    sample writes in place), in batch order."""
    trace = Trace.from_arrays(np.zeros(2), np.array([12, 20]), np.array([6, 6]), n=np.array([4, 4]))
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=100, prefix_caching=prefix), SchedulerConfig())
    assert build_run(trace, cfg).scheduler._lazy
    assert _side_by_side(trace, cfg) >= 2
    parts = build_run(trace, cfg)
    plans = [plan for _, plan in engine_steps(trace, parts)]
    assert plans[0].prefill_tokens == 32 and not plans[0].copies
    copies = plans[1].copies
    assert len(copies) == 6 and plans[1].decode_seqs == 8
    # request 0's prompt holds blocks 0, 1 (block 1 partly filled); request 1's 2, 3, 4 (block 4 partly)
    assert [src for src, _ in copies] == [1, 1, 1, 4, 4, 4]
    assert len({dst for _, dst in copies}) == 6
