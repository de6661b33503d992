"""The replay of a hybrid model on the interpreter: kvsim's hybrid allocator (one block table per KV cache
group over one shared pool) drives real kernels, a sliding-window group (W = 8 tokens, blocks of 4)
beside a full-attention group, each group's layers paging into the same per-layer tensors (vLLM's
layout). Held blocks equal kvsim's at every step, attention equals the reference over each group's
window, and faults in the tables or the kernel's window are caught."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from gpu_harness import replay_pool
from gpu_harness.replay import ReplayShape, replay
from kvsim.alloc.hybrid import HybridAllocator
from kvsim.alloc.hybrid.groups import SlidingRules
from kvsim.alloc.hybrid.ticks import HybridTicks
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, ModelSpec, get_gpu
from kvsim.specs.layers import LayerGroup, MambaState
from kvsim.trace.table import Trace

W, BS = 8, 4
#: gpt-oss's layout in miniature: half the layers sliding (window W), half full attention.
TINY_OSS = ModelSpec("tiny-oss", 4, 256, 4, 2, 16, 2, 64, 1e8,
                     layer_groups=(LayerGroup("sliding", 2, 2, 16, window=W), LayerGroup("full", 2, 2, 16)))
SHAPE = ReplayShape(q_heads=4, kv_heads=2, head_dim=16, num_layers=2, dtype=torch.float32)


def config(num_blocks=40, preemption="recompute", async_scheduling=None):
    return SimConfig(Deployment(TINY_OSS, get_gpu("a100-40gb")), CacheConfig(block_size=BS, num_blocks=num_blocks),
                     SchedulerConfig(preemption=preemption, async_scheduling=async_scheduling))


def trace():
    rng = np.random.default_rng(0)
    num = 6
    return Trace.from_arrays(np.sort(rng.uniform(0, 0.05, num)), rng.integers(13, 30, num),
                             rng.integers(10, 30, num))


def one_request(prompt, output=3):
    return Trace.from_arrays(np.zeros(1), np.array([prompt]), np.array([output]))


@pytest.mark.parametrize("preemption", ["recompute", pytest.param("swap", marks=pytest.mark.long)])
def test_hybrid_replay_matches_kvsim_through_preemptions(preemption):
    """40 blocks: the six requests outgrow the pool and one is preempted; at every step the distinct
    blocks of the live (sequence, group) tables equal kvsim's used blocks (and the SimPy run's), every
    written token not yet skipped reads back, and every decode on both groups matches the reference.
    The `ideal` profile (no CPU time per step) pins the step timing that makes the pool overflow."""
    tr, cfg = trace(), replace(config(40, preemption), engine_profile="ideal")
    predicted = simulate(tr, cfg).steps.used_blocks.tolist()
    report = replay(tr, cfg, SHAPE, "cpu", predicted)
    assert report.ok, report
    assert report.preemptions >= 1 and report.steps == len(predicted)
    assert report.max_held_blocks == max(predicted) == 40
    assert report.checked_steps > 0 and report.worst_abs_err < 1e-4


def test_sliding_group_frees_blocks_the_window_left():
    """One request of 30 prompt tokens and 20 output tokens (49 tokens written): the full group ends
    with cdiv(49, 4) = 13 blocks; the sliding group keeps the blocks from the one holding token
    49 - 8 = 41 (the window of the last decode, [41, 49) plus the block of token 48): blocks 10..12,
    3 blocks. Most held: at the prefill, 8 + 8 blocks (nothing skipped yet)."""
    tr, cfg = one_request(30, 20), config(40)
    report = replay(tr, cfg, SHAPE, "cpu", check_every=4)
    assert report.ok, report
    assert report.max_held_blocks == 16
    predicted = simulate(tr, cfg).steps.used_blocks.tolist()
    assert predicted[-1] == 13 + 3


def test_a_token_written_through_a_skipped_entry_is_caught(monkeypatch):
    """Fault injection: the sliding group skips two blocks too early. A prompt of 19 tokens: at the first
    decode 19 tokens are computed and the faulty rule nulls (19 + 8 - 8 + 1) // 4 = 5 entries, the 5th
    (tokens 16..19) holding the new token 19, which must not be written into the null block."""
    original = SlidingRules.skipped_entries
    monkeypatch.setattr(SlidingRules, "skipped_entries", lambda self, c: original(self, c + 2 * self.block_size))
    monkeypatch.setattr(HybridTicks, "can_tick", False)   # (the lazy path's ticks drop blocks at events
                                                          # of their own: the fault is the per-sequence rule)
    report = replay(one_request(19), config(40, async_scheduling=False), SHAPE, "cpu")   # (synchronous)
    assert not report.ok
    assert report.first_mismatch == ("step 1: sequence 0 writes token 19 through a null entry (block 4) "
                                     "of group 0 (sliding)")


def test_a_window_block_in_a_skipped_entry_is_caught(monkeypatch):
    """Fault injection: the sliding group skips one block too early. A prompt of 18: at the first decode
    the faulty rule nulls (18 + 4 - 8 + 1) // 4 = 3 entries, but the decode of token 18 (context 19)
    reads the window [11, 19), which starts in block 2. The healthy rule nulls (18 - 8 + 1) // 4 = 2."""
    original = SlidingRules.skipped_entries
    monkeypatch.setattr(SlidingRules, "skipped_entries", lambda self, c: original(self, c + self.block_size))
    monkeypatch.setattr(HybridTicks, "can_tick", False)   # (the lazy path's ticks drop blocks at events
                                                          # of their own: the fault is the per-sequence rule)
    report = replay(one_request(18), config(40, async_scheduling=False), SHAPE, "cpu")   # (synchronous)
    assert report.first_mismatch == ("step 1: group 0 (sliding): sequence 0: block 2 is null but holds "
                                     "tokens of the window [11, 19)")
    monkeypatch.undo()
    healthy = replay(one_request(18), config(40, async_scheduling=False), SHAPE, "cpu")
    assert healthy.ok, healthy


def test_a_kernel_reading_outside_the_window_is_caught(monkeypatch):
    """Fault injection: the sliding group's decode reads one block more than its window (tokens the
    window left, or the null page). The reference attends to the window only: the outputs differ."""
    real = replay_pool.paged_decode

    def wide(*args, window=None, **kwargs):
        return real(*args, window=None if window is None else window + BS, **kwargs)

    monkeypatch.setattr(replay_pool, "paged_decode", wide)
    report = replay(one_request(21, 6), config(40), SHAPE, "cpu")
    assert report.first_mismatch is None
    assert report.worst_abs_err > 1e-2 and not report.ok


def test_skipped_blocks_left_in_the_tables_are_caught(monkeypatch):
    """Fault injection: the tables the kernels get keep naming the blocks a window skipped (freed and
    handed out again). The pool then holds more blocks than kvsim counts, or a new owner's writes
    overwrite what the stale entry reads back."""
    original, seen = HybridAllocator.group_block_tables, {}

    def stale(self, seq_id):
        tables = original(self, seq_id)
        memo = seen.setdefault(seq_id, [[] for _ in tables])
        for g, table in enumerate(tables):
            for j, block in enumerate(table):       # the last block each entry named
                if j >= len(memo[g]):
                    memo[g].append(block)
                elif block >= 0:
                    memo[g][j] = block
            tables[g] = [memo[g][j] if block < 0 else block for j, block in enumerate(table)]
        return tables

    monkeypatch.setattr(HybridAllocator, "group_block_tables", stale)
    report = replay(one_request(30, 12), config(40), SHAPE, "cpu", check_every=1000)
    assert not report.ok
    assert "blocks in use" in report.first_mismatch or "reads back other data" in report.first_mismatch


def test_device_check_hybrid_prediction_is_the_simulators():
    """gpu_harness/device_check.sh (STEPS=hybrid) replays 300 Alpaca-like requests at gpt-oss-20b's shape
    on an H200 against this shipped prediction, which must stay what kvsim predicts for the same flags."""
    from pathlib import Path

    from kvsim.specs import get_model
    from kvsim.trace.formats import load_trace
    root = Path(__file__).resolve().parents[2]
    name = "alpaca-300-gpt-oss-20b-h200"
    cfg = SimConfig(Deployment(get_model("gpt-oss-20b"), get_gpu("h200")), CacheConfig(), SchedulerConfig(),
                    engine_profile="ideal")
    predicted = simulate(load_trace(root / "traces" / "alpaca_30rps_2min.jsonl").head(300), cfg)
    rows = (root / "gpu_harness" / "expected" / f"{name}.csv").read_text().splitlines()
    assert rows[0] == "step,used_blocks"
    assert [int(r.split(",")[1]) for r in rows[1:]] == predicted.steps.used_blocks.tolist()
    assert f"{name}:" in (root / "gpu_harness" / "device_check.sh").read_text()


def run_model(model, cache, tr, async_scheduling=None):
    cfg = SimConfig(Deployment(model, get_gpu("a100-40gb")), cache, SchedulerConfig(async_scheduling=async_scheduling))
    predicted = simulate(tr, cfg).steps.used_blocks.tolist()
    return replay(tr, cfg, SHAPE, "cpu", predicted), predicted


def test_chunked_local_group_replays_with_its_chunk():
    """Llama 4's layout in miniature (chunks of 8 tokens beside full attention, vLLM's hybrid manager
    turned on): one request of 30 + 12 tokens (41 written). At the last decode 40 tokens are computed,
    so the chunked group skips 40 // 8 * 8 = 40 tokens, 10 of its cdiv(41, 4) = 11 entries: it holds 1
    block, the full group 11 (synchronous scheduling). Under async scheduling the last decode is planned
    with one token in flight: it frees from 39, skipping 39 // 8 * 8 = 32 tokens, 8 entries: 3 + 11 blocks,
    held through one more (empty) step."""
    model = ModelSpec("tiny-scout", 4, 256, 4, 2, 16, 2, 64, 1e8,
                      layer_groups=(LayerGroup("chunked", 2, 2, 16, chunk=8), LayerGroup("full", 2, 2, 16)))
    cache = CacheConfig(block_size=BS, num_blocks=40, hybrid_kv_cache=True)
    report, predicted = run_model(model, cache, one_request(30, 12), async_scheduling=False)
    assert report.ok, report
    assert predicted[-1] == 1 + 11
    report, predicted = run_model(model, cache, one_request(30, 12))
    assert report.ok, report
    assert predicted[-2:] == [3 + 11, 3 + 11]


def test_mamba_group_is_counted_not_paged():
    """Qwen3-Next's layout in miniature (Mamba layers beside full attention): vLLM raises the block size
    to 16 so one block holds a layer's Mamba state; one request of 30 + 12 tokens ends holding its
    state block and cdiv(41, 16) = 3 full-attention blocks. The replay pages the full group only."""
    state = MambaState(conv_dim=8, conv_kernel=4, ssm_heads=2, ssm_shape=(4, 4), conv_dtype_bytes=2,
                       ssm_dtype_bytes=2)
    model = ModelSpec("tiny-next", 4, 256, 4, 2, 16, 2, 64, 1e8,
                      layer_groups=(LayerGroup("mamba", 2, state=state), LayerGroup("full", 2, 2, 16)))
    report, predicted = run_model(model, CacheConfig(block_size=BS, num_blocks=40), one_request(30, 12))
    assert report.ok, report
    assert predicted[-1] == 1 + 3


@pytest.mark.long
def test_mamba_prefix_caching_replays():
    """Mamba beside full attention with prefix caching (vLLM's align mode, kvsim/alloc/hybrid/mamba.py):
    six requests sharing a 40-token prefix take hits (fewer tokens written than computed without) and the
    pool reads back what was written, Mamba states shared by hits counted once each."""
    state = MambaState(conv_dim=8, conv_kernel=4, ssm_heads=2, ssm_shape=(4, 4), conv_dtype_bytes=2,
                       ssm_dtype_bytes=2)
    model = ModelSpec("tiny-next", 4, 256, 4, 2, 16, 2, 256, 1e8,
                      layer_groups=(LayerGroup("mamba", 2, state=state), LayerGroup("full", 2, 2, 16)))
    rng = np.random.default_rng(1)
    num = 6
    tr = Trace.from_arrays(np.sort(rng.uniform(0, 0.5, num)), rng.integers(50, 70, num), rng.integers(5, 9, num),
                           prefix_group=["g"] * num, prefix_tokens=[40] * num)
    report, _ = run_model(model, CacheConfig(block_size=BS, num_blocks=40, prefix_caching=True), tr)
    assert report.ok, report
    assert report.tokens_written < int(tr.prompt_tokens.sum() + (tr.output_tokens - 1).sum())


def test_prefix_cache_hits_across_groups():
    """Five requests sharing a 20-token prefix: later ones take their hits from both groups (the sliding
    group only the blocks its window still reads) and the pool reads them back as written."""
    rng = np.random.default_rng(1)
    num = 5
    tr = Trace.from_arrays(np.sort(rng.uniform(0, 0.2, num)), rng.integers(24, 30, num), rng.integers(5, 9, num),
                           prefix_group=["g"] * num, prefix_tokens=[20] * num)
    report, _ = run_model(TINY_OSS, CacheConfig(block_size=BS, num_blocks=40, prefix_caching=True), tr)
    assert report.ok, report
    assert report.tokens_written < int(tr.prompt_tokens.sum() + (tr.output_tokens - 1).sum())
