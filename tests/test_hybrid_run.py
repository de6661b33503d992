"""Hybrid models end to end (issue 23): `build_run` serves them with vLLM's KV cache plan and, where a
group frees blocks or holds a state, the hybrid allocator; blocks per step worked by hand; what the
hybrid allocator cannot do yet is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.alloc.hybrid import HybridAllocator
from kvsim.alloc.paged import PagedAllocator
from kvsim.cli.app import app
from kvsim.engine.build import build_run
from kvsim.engine.config import kv_cache_plan
from kvsim.planning.runs import make_config
from kvsim.trace.table import Trace

ONE = Trace.from_arrays(np.array([0.0]), np.array([1000]), np.array([50]))


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_one_request_blocks_per_step_by_hand():
    """gpt-oss-20b: 12 sliding (W 128) + 12 full layers, two KV cache groups of 16-token blocks. The
    prefill step writes 1000 tokens into both groups (63 + 63 blocks); from then on the sliding group
    keeps only the blocks its window still reads: with C tokens computed it skips max(0, C - 127) tokens
    (vLLM's SlidingWindowManager), whole blocks of them, before taking the next token's slot."""
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096)
    expected = [2 * _cdiv(1000, 16)]
    for k in range(1, 50):                       # decode step k: 1000 + k - 1 computed, one more slot
        entries = _cdiv(1000 + k, 16)
        expected.append(entries + entries - max(0, 1000 + k - 1 - 127) // 16)
    assert r.steps.used_blocks.tolist() == expected
    assert expected[:3] == [126, 72, 72] and expected[-1] == 75
    assert r.summary["kv"]["num_blocks"] == 1000 and r.summary["kv"]["capacity_tokens"] == 16000


def test_uniform_pages_hold_every_layers_blocks():
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096,
                       hybrid_kv_cache=False)
    assert r.steps.used_blocks.tolist() == [_cdiv(1000 + k, 16) for k in range(50)]   # 63 .. 66


@pytest.mark.parametrize("model, flags, kind, groups", [
    ("gpt-oss-120b", {}, HybridAllocator, [("sliding", 128, 0), ("full", 0, 0)]),
    ("gpt-oss-120b", {"hybrid_kv_cache": False}, PagedAllocator, None),
    ("deepseek-v3", {"tp": 8}, PagedAllocator, None),                       # MLA: one group of latents
    ("llama-4-scout", {"tp": 8}, PagedAllocator, None),                     # vLLM turns the manager off
    ("llama-4-scout", {"tp": 8, "hybrid_kv_cache": True}, HybridAllocator,
     [("chunked", 0, 8192)] * 3 + [("full", 0, 0)]),                        # 36 + 12 layers: groups of 12
    ("qwen3-next-80b-a3b", {"tp": 4}, HybridAllocator, [("mamba", 0, 0)] * 3 + [("full", 0, 0)]),
])
def test_build_run_follows_vllms_plan(model, flags, kind, groups):
    cfg = make_config(model=model, gpu="h200", max_model_len=32768, **flags)
    plan = kv_cache_plan(cfg.resolved())
    parts = build_run(ONE, cfg)
    assert type(parts.allocator) is kind
    assert parts.capacity_tokens == plan.num_blocks * plan.block_size and parts.block_size == plan.block_size
    if groups is not None:
        assert [(g.kind, g.window, g.chunk) for g in parts.allocator.groups] == groups


def test_what_the_hybrid_allocator_cannot_do_is_one_line(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 10, "output_tokens": 5}\n')
    res = CliRunner().invoke(app, ["run", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--max-model-len", "4096", "--prefix-caching"])
    assert res.exit_code == 2 and "prefix caching" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["run", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--max-model-len", "4096", "--prefix-caching", "--no-hybrid-kv-cache"])
    assert res.exit_code == 0, res.output
