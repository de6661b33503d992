"""vLLM 0.33's async scheduling (`--async-scheduling`, its default) against kvsim's scheduler with
`use_async_scheduling()` (kvsim/engine/batching/settle.py) over the hybrid allocator, step by step: used blocks
after each step's scheduling, blocks per group, preemptions, finishes, tokens scheduled (empty steps
included: vLLM queues an empty batch while the requests that finished are still in flight) and, with
prefix caching, each request's hit tokens. vLLM's side: `AsyncScheduler` driven as
`EngineCore.step_with_batch_queue` drives it, two batches in flight
(tests/vllm/hybrid_scheduler_oracle_driver.py, engine configured by vLLM's start-up functions).

The cases are those of the synchronous checks (tests/vllm/test_hybrid_scheduler_oracle.py: full + sliding,
full + chunked, full + Mamba, sliding + full + Mamba, prefix caching on several layouts, the realistic
gpt-oss-, Gemma-3- and Llama-4-like mixes; tests/vllm/test_hybrid_retention_oracle.py: retention 0, an
interval and none) with async scheduling on. Async doubles the sliding and chunked groups' admission cap
(two batches in flight), so vLLM's start-up refuses a few of those pools for their max_model_len: each gets
the fewest extra blocks vLLM's start-up accepts (`EXTRA`, found by trying vLLM's `startup`).

Then Mamba prefix caching under async scheduling: every case of tests/vllm/test_hybrid_mamba_oracle.py
(vLLM's "align" mode; full + Mamba, Jamba-, Qwen3-Next-like, sliding + full + Mamba at block 4, full + Mamba
and Qwen3-Next-like at block 16; retention 0, an interval and none; with and without Mamba-2 prefill
checkpoints) with async scheduling on. vLLM's start-up accepts each of those pools as it is (no extra
blocks: their attention groups are full attention, whose admission cap does not grow with the batches in
flight). What async changes there: vLLM's running loop skips a request whose last token is in flight
(kvsim/engine/batching/in_order.py), a Mamba group frees the state block it leaves only when the step
that left it has completed (`remove_skipped_blocks` on the processed tokens), and a growth caches
states only up to the tokens known (`allocate_slots` caps `cache_blocks` at `request.num_tokens`: the
prompt and the outputs already returned), which moves the sparse retention's checkpoints.

Golden: tests/data/hybrid_oracle/async_vllm_0.33.json.gz and async_mamba_vllm_0.33.json.gz (`python
tests/vllm/test_hybrid_async_oracle.py` regenerates both with the oracle venv); live: `--long` reruns
vLLM and must reproduce them.
"""

import json
from pathlib import Path

import pytest

from tests.vllm.scheduler_golden import assert_same_steps, regenerate, vllm_records
from tests.vllm.test_hybrid_oracle import _oracle_python, load_golden
from tests.vllm import test_hybrid_mamba_oracle as mamba
from tests.vllm import test_hybrid_retention_oracle as retention
from tests.vllm import test_hybrid_scheduler_oracle as scheduler

DATA = Path(__file__).parents[1] / "data" / "hybrid_oracle" / "async_vllm_0.33.json.gz"
MAMBA_DATA = DATA.with_name("async_mamba_vllm_0.33.json.gz")
# extra blocks per case so vLLM's start-up accepts the pool with two batches in flight (small, realistic,
# retention cases in order)
EXTRA = ([0, 0, 0, 2, 0, 0, 8, 3, 0, 2, 10, 0], [93, 0, 0, 13], [3, 3, 3, 6, 6, 6, 2, 2, 13, 13, 13, 0, 0, 0, 0, 0, 0])
_SMALL, _REALISTIC = len(EXTRA[0]), len(EXTRA[1])


def cases() -> list[dict]:
    out = []
    for make, extra in zip((scheduler.cases, scheduler.realistic_cases, retention.cases), EXTRA):
        made = make()
        assert len(made) == len(extra)
        out += [dict(c, async_scheduling=True, num_blocks=c["num_blocks"] + x) for c, x in zip(made, extra)]
    return out


def mamba_cases() -> list[dict]:
    """The Mamba prefix caching cases (tests/vllm/test_hybrid_mamba_oracle.py) with async scheduling."""
    return [dict(c, async_scheduling=True) for c in mamba.cases()]


def _check(which: slice) -> None:
    golden, all_cases = load_golden(DATA), cases()
    assert len(golden) == len(all_cases)
    for case, want in list(zip(all_cases, golden))[which]:
        assert_same_steps(case, scheduler.run_kvsim(case), want)


def test_kvsim_async_equals_vllm_step_by_step_small():
    """Block 4: every layout kind, prefix caching off and on, retention 0 / 16 / none."""
    _check(slice(0, _SMALL))
    _check(slice(_SMALL + _REALISTIC, _SMALL + _REALISTIC + 11))


@pytest.mark.long
def test_kvsim_async_equals_vllm_step_by_step_realistic():
    _check(slice(_SMALL, _SMALL + _REALISTIC))
    _check(slice(_SMALL + _REALISTIC + 11, None))


def test_async_differs_from_sync_in_vllm():
    """The check can fail: vLLM's async records differ from its synchronous ones for the same workload
    (the same pool where no extra blocks were needed): finished requests hold their blocks a step longer,
    so the async run has empty steps and more blocks used at some step."""
    golden, sync = load_golden(DATA), load_golden(scheduler.DATA)
    small = scheduler.cases()
    differ = 0
    for k in range(_SMALL):
        if EXTRA[0][k]:
            continue
        a, s = golden[k], sync[k]
        assert any(r.get("tokens") == 0 for r in a) and not any(r.get("tokens") == 0 for r in s)
        differ += a != s
        assert sum(len(r.get("finished", ())) for r in a) == len(small[k]["requests"])
    assert differ >= 6


def _check_mamba(block_size: int) -> None:
    golden, all_cases = load_golden(MAMBA_DATA), mamba_cases()
    assert len(golden) == len(all_cases) == 30
    for case, want in zip(all_cases, golden):
        if case["block_size"] == block_size:
            assert_same_steps(case, scheduler.run_kvsim(case), want)


def test_kvsim_async_equals_vllm_with_mamba_prefix_caching():
    """Block 4: four layouts at retention 0, 16 and none, two of them also with prefill checkpoints."""
    _check_mamba(block_size=4)


@pytest.mark.long
def test_kvsim_async_equals_vllm_with_mamba_prefix_caching_at_realistic_sizes():
    """Block 16: full + Mamba and Qwen3-Next-like at retention 0, 256 and none, with and without."""
    _check_mamba(block_size=16)


def test_async_mamba_differs_from_sync_in_vllm():
    """The check can fail: for every Mamba case vLLM's async records differ from its synchronous ones
    (tests/data/hybrid_oracle/mamba_vllm_0.33.json.gz): empty steps appear, every request still
    finishes, and each case's hit tokens differ (states cached up to the known tokens only, freed later)."""
    golden, sync = load_golden(MAMBA_DATA), load_golden(mamba.DATA)
    assert len(golden) == len(sync)
    for a, s in zip(golden, sync):
        assert a != s
        assert any(r.get("tokens") == 0 for r in a) and not any(r.get("tokens") == 0 for r in s)
        assert sum(len(r.get("finished", ())) for r in a) == sum(len(r.get("finished", ())) for r in s)
    assert all(a[-1]["hits"] != s[-1]["hits"] for a, s in zip(golden, sync))


@pytest.mark.long
@pytest.mark.skipif(_oracle_python() is None, reason="no vLLM oracle venv (../shared/oracle/setup.sh builds it)")
def test_vllm_live_reproduces_the_golden(tmp_path):
    assert json.loads(vllm_records(cases(), tmp_path, timeout=900)) == load_golden(DATA)
    assert json.loads(vllm_records(mamba_cases(), tmp_path, timeout=600)) == load_golden(MAMBA_DATA)


if __name__ == "__main__":      # regenerate the golden files with vLLM (the oracle venv must exist)
    regenerate(cases(), DATA, "async")
    regenerate(mamba_cases(), MAMBA_DATA, "async_mamba")
