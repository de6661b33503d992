"""vLLM 0.33's flags for hybrid models, worked out by hand: `--prefix-cache-retention-interval` (default
0), `--async-scheduling/--no-async-scheduling` (the sliding group's admission cap follows the batches in
flight), `--num-gpu-blocks-override` (counts vLLM's null block) against `--num-blocks` (usable), and the
per-group columns of steps.csv (blocks held, blocks a window freed)."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.alloc.hybrid import GroupSpec, HybridAllocator
from kvsim.alloc.hybrid.retention import reachable_mask
from kvsim.cli.app import app
from kvsim.engine.build import build_run
from kvsim.planning.runs import make_config
from kvsim.planning.sweep.grid import grid_points

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "traces" / "tiny.jsonl"
GPT_OSS = dict(model="gpt-oss-20b", gpu="h100-80gb", max_model_len=8192, max_batched_tokens=2048, num_blocks=1500)


def test_reachable_mask_by_hand():
    """Window 8, block 4: a hit needs cdiv(7, 4) = 2 blocks. Prompt 30 tokens: replay boundary 29 ->
    block-floored 28 = block 7, so blocks 5 and 6 are kept; a junction at 16 keeps blocks 2 and 3; an
    interval of 16 (4 blocks a segment) keeps the last 2 of every segment: 2, 3, 6, 7."""
    assert reachable_mask(0, 8, 4, 8, None, (29,)) is None
    assert reachable_mask(0, 8, 4, 8, 0, (29,)) == [False] * 5 + [True, True, False]
    assert reachable_mask(0, 8, 4, 8, 0, (29, 16)) == [False, False, True, True, False, True, True, False]
    assert reachable_mask(0, 8, 4, 8, 16, (29,)) == [False, False, True, True, False, True, True, True]
    assert reachable_mask(4, 8, 4, 8, 0, (29,)) == [False, True, True, False]     # (from block 4 on)
    assert reachable_mask(0, 8, 4, 8, 8, (29,)) is None     # 2 blocks a segment <= the 2 a hit needs


def test_the_first_sibling_gets_no_sliding_hit_the_next_one_hits_at_the_junction():
    """Full + sliding window 8, block 4, retention 0. Request A (prompt 40, 10 blocks) caches its full
    group densely but its sliding group only blocks 7 and 8 (replay boundary 39 -> 36 = block 9). B shares
    A's first 24 tokens: the full group hits 6 blocks, the sliding group none there: hit 0, junction 24, so
    B caches sliding blocks 4 and 5. C shares the same 24 tokens: hit 24 tokens."""
    a = HybridAllocator(64, 4, [GroupSpec("full"), GroupSpec("sliding", window=8)], 256, 64, prefix_caching=True)
    shared = list(range(1, 7))
    assert a.allocate(0, 40, 41, shared + [100, 101, 102, 103]) == 0
    assert a.allocate(1, 32, 33, shared + [200, 201]) == 0
    assert a._seqs[1].marks == (31, 24)
    assert a.allocate(2, 32, 33, shared + [300, 301]) == 24
    dense = HybridAllocator(64, 4, [GroupSpec("full"), GroupSpec("sliding", window=8)], 256, 64,
                            prefix_caching=True, retention_interval=None)
    dense.allocate(0, 40, 41, shared + [100, 101, 102, 103])
    assert dense.allocate(1, 32, 33, shared + [200, 201]) == 24     # (dense: the first sibling hits too)


def test_async_scheduling_sets_the_sliding_admission_cap():
    """gpt-oss-20b's sliding group (window 128, block 16) with 2048 tokens a step: two batches in flight
    cap a request at cdiv(127 + 4096, 16) + 1 = 265 blocks, one batch at cdiv(127 + 2048, 16) + 1 = 137."""
    trace = kvsim.generate_trace("alpaca", num_requests=2, seed=0)
    on = build_run(trace, make_config(**GPT_OSS)).allocator
    off = build_run(trace, make_config(**GPT_OSS, no_async_scheduling=True)).allocator
    assert [g.kind for g in on.groups] == ["sliding", "full"]
    assert on.rules[0].cap_blocks == 265 and off.rules[0].cap_blocks == 137
    assert on.retention_interval == 0          # vLLM's default
    assert build_run(trace, make_config(**GPT_OSS, prefix_cache_retention_interval="none")).allocator.retention_interval is None


def test_flags_on_the_command_line_and_in_grids(tmp_path):
    runner = CliRunner()

    def config(*args):
        out = tmp_path / str(len(list(tmp_path.iterdir())))
        res = runner.invoke(app, ["run", str(TINY), "--quiet", "--model", "llama-2-13b", "--out", str(out), *args])
        assert res.exit_code == 0, res.output
        return json.loads((out / "config.json").read_text())
    assert config("--num-gpu-blocks-override", "501")["cache"]["num_blocks"] == 500
    assert config("--num-blocks", "500")["cache"]["num_blocks"] == 500
    got = config("--prefix-cache-retention-interval", "none", "--no-async-scheduling")
    assert got["cache"]["prefix_cache_retention_interval"] is None and got["scheduler"]["async_scheduling"] is False
    assert config()["cache"]["prefix_cache_retention_interval"] == 0
    res = runner.invoke(app, ["run", str(TINY), "--quiet", "--num-gpu-blocks-override", "1"])
    assert res.exit_code == 2 and "null block" in res.output
    res = runner.invoke(app, ["run", str(TINY), "--quiet", "--model", "llama-2-13b",
                              "--prefix-cache-retention-interval", "64"])
    assert res.exit_code == 2 and "no sliding-window or Mamba" in res.output
    points = grid_points({"prefix_cache_retention_interval": [0, "none", 64], "async_scheduling": ["false"]})
    assert [(p["prefix_cache_retention_interval"], p["async_scheduling"]) for p in points] == [(0, False), (None, False), (64, False)]


def test_steps_csv_has_each_groups_blocks_and_what_its_window_freed():
    """Every step: the groups' blocks sum to the used blocks (nothing shared without hits); the sliding
    group's freed count never falls and ends at the summary's `freed_blocks`; the full group frees none."""
    trace = kvsim.generate_trace("sharegpt", rate_rps=4, num_requests=40, seed=1)
    r = kvsim.simulate(trace, **GPT_OSS, prefix_caching=False)
    steps, groups = r.steps, r.summary["kv"]["groups"]
    assert (steps.group0_blocks + steps.group1_blocks == steps.used_blocks).all()
    assert (steps.group0_freed.diff().dropna() >= 0).all() and (steps.group1_freed == 0).all()
    assert groups[0]["kind"] == "sliding" and groups[0]["freed_blocks"] == steps.group0_freed.iloc[-1] > 0
    assert groups[1]["freed_blocks"] == 0


def test_a_single_allocator_counts_the_blocks_a_window_frees():
    """Window 4, block 2: after C computed tokens, (C - 3) // 2 leading blocks are skipped; a sequence
    grown to 10 tokens (C = 9 when it asks for its 10th) has freed 3 blocks of its sliding group."""
    a = HybridAllocator(20, 2, [GroupSpec("full"), GroupSpec("sliding", window=4)], 64, 8)
    a.record_groups = True
    a.allocate(0, 2, 10)
    for _ in range(8):
        a.append(0)
    s = a.stats()
    assert (s.group0_freed, s.group1_freed) == (0, 3)
    assert (s.group0_blocks, s.group1_blocks) == (5, 2)
    with pytest.raises(ValueError, match="multiple of the block size"):
        HybridAllocator(20, 2, [GroupSpec("full"), GroupSpec("sliding", window=4)], 64, 8, retention_interval=3)
