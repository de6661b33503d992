"""Hybrid models end to end (issue 23): `build_run` serves them with vLLM's KV cache plan and, where a
group frees blocks or holds a state, the hybrid allocator; blocks per step worked by hand; what the
hybrid allocator cannot do yet is refused in one line."""

from __future__ import annotations

import numpy as np
import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.alloc.hybrid import HybridAllocator
from kvsim.alloc.paged.allocator import PagedAllocator
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
    (vLLM's SlidingWindowManager), whole blocks of them, before taking the next token's slot.
    Synchronous scheduling (`--no-async-scheduling`; async: the next test)."""
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096,
                       async_scheduling=False)
    expected = [2 * _cdiv(1000, 16)]
    for k in range(1, 50):                       # decode step k: 1000 + k - 1 computed, one more slot
        entries = _cdiv(1000 + k, 16)
        expected.append(entries + entries - max(0, 1000 + k - 1 - 127) // 16)
    assert r.steps.used_blocks.tolist() == expected
    assert expected[:3] == [126, 72, 72] and expected[-1] == 75
    assert r.summary["kv"]["num_blocks"] == 1000 and r.summary["kv"]["capacity_tokens"] == 16000


def test_one_request_blocks_per_step_by_hand_under_async_scheduling():
    """The same run under async scheduling (vLLM 0.33's default): a step is planned while the one before
    runs, so the sliding group frees only out of the tokens whose step completed (vLLM's
    `allocate_slots`: computed less `num_in_flight_tokens`). Decode step 1 is planned with the 1000
    prompt tokens in flight (skips nothing: 126 blocks); step k >= 2 with one token in flight (skips
    max(0, 1000 + k - 2 - 127) tokens); the request, finished by step 49, holds its blocks through
    one more (empty, 0 s) step before it is freed."""
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096)
    expected = [2 * _cdiv(1000, 16), 2 * _cdiv(1001, 16)]
    for k in range(2, 50):
        entries = _cdiv(1000 + k, 16)
        expected.append(entries + entries - max(0, 1000 + k - 2 - 127) // 16)
    expected.append(expected[-1])
    assert r.steps.used_blocks.tolist() == expected
    assert expected[:4] == [126, 126, 72, 72] and expected[-2:] == [75, 75]
    assert r.steps.decode_tokens.tolist()[-1] == 0 and r.steps.duration_s.tolist()[-1] == 0.0


def test_uniform_pages_hold_every_layers_blocks():
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096,
                       hybrid_kv_cache=False, async_scheduling=False)
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
    # vLLM's pool of plan.num_blocks keeps block 0 back as its null block (vllm/v1/core/block_pool.py)
    assert parts.capacity_tokens == (plan.num_blocks - 1) * plan.block_size and parts.block_size == plan.block_size
    if groups is not None:
        assert [(g.kind, g.window, g.chunk) for g in parts.allocator.groups] == groups


def test_what_the_hybrid_allocator_cannot_do_is_one_line(tmp_path):
    """Parallel samples / beams are refused in one line (exit 2), and prefix caching with Mamba groups
    under Jenga's allocator; prefix caching over sliding and full groups runs, and with Mamba groups under
    vLLM's hybrid manager (its "align" mode: kvsim/alloc/hybrid/mamba.py)."""
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_text('{"arrival_s": 0, "prompt_tokens": 40, "output_tokens": 5}\n')
    two.write_text('{"arrival_s": 0, "prompt_tokens": 40, "output_tokens": 5, "n": 2}\n')
    base = ["--gpu", "h100-80gb", "--max-model-len", "4096"]
    res = CliRunner().invoke(app, ["run", str(two), "--model", "gpt-oss-20b", *base])
    assert res.exit_code == 2 and "one sequence per request" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(app, ["run", str(one), "--model", "qwen3-next-80b-a3b", "--tp", "4", *base,
                                   "--prefix-caching"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["run", str(one), "--model", "qwen3-next-80b-a3b", "--tp", "4", *base,
                                   "--prefix-caching", "--allocator", "jenga", "--kv-gib", "20"])
    assert res.exit_code == 2 and "prefix caching with a Mamba group" in res.output and "Traceback" not in res.output
    for extra in (["--prefix-caching"], ["--prefix-caching", "--no-hybrid-kv-cache"], []):
        res = CliRunner().invoke(app, ["run", str(two if not extra else one), "--model", "gpt-oss-20b", *base,
                                       *extra, *(["--no-hybrid-kv-cache"] if not extra else [])])
        assert res.exit_code == 0, (extra, res.output)


def test_jenga_pool_from_the_deployment_by_hand():
    """Gemma 3 27B under `--allocator jenga`, 4 GiB of KV on one GPU: one group per kind at its natural
    page, 16 tokens of 16 KV heads x 128 x 2 (K, V) x 2 bytes = 131,072 bytes per layer: sliding
    52 x 131,072 = 6,815,744 bytes, full 10 x 131,072 = 1,310,720; large pages of their LCM
    2^19 x 13 x 5 = 34,078,720 bytes, 126 of them in 4 GiB."""
    from kvsim.alloc.jenga import JengaAllocator
    parts = build_run(ONE, make_config(model="gemma-3-27b", gpu="h100-80gb", kv_gib=4, max_model_len=4096,
                                       allocator="jenga"))
    alloc = parts.allocator
    assert type(alloc) is JengaAllocator
    assert [(g.kind, g.window, g.page_bytes) for g in alloc.groups] == [("sliding", 1024, 6_815_744),
                                                                       ("full", 0, 1_310_720)]
    assert alloc.layout.large_page_bytes == 34_078_720 and alloc.layout.num_large == 4 * 1024**3 // 34_078_720
    with pytest.raises(ValueError, match="--allocator jenga sizes its pool in bytes"):
        make_config(model="gemma-3-27b", allocator="jenga", num_blocks=100)


def test_jenga_runs_the_study_trace_with_the_hybrid_managers_blocks_at_one_page_size():
    """gpt-oss's two kinds have the same page, so Jenga's large page is one page and it holds blocks as
    vLLM's hybrid manager does: the same run, step for step (without prefix caching, where Jenga keeps
    blocks that left the window as held)."""
    # (synchronous scheduling: kvsim's Jenga frees window blocks at once, the hybrid manager under async
    # scheduling one step late, kvsim/engine/batching/settle.py)
    flags = dict(model="gpt-oss-20b", gpu="h100-80gb", kv_gib=1, max_model_len=4096, prefix_caching=False,
                 async_scheduling=False)
    a = kvsim.simulate(ONE, allocator="jenga", **flags)
    b = kvsim.simulate(ONE, **flags)
    assert a.steps.used_blocks.tolist() == b.steps.used_blocks.tolist()
    # (the hybrid manager's pool less vLLM's null block; Jenga's large pages keep none back)
    assert a.summary["kv"]["capacity_tokens"] == b.summary["kv"]["capacity_tokens"] + 16


def test_per_group_breakdown_by_hand():
    """The summary's `kv.groups` of the one-request gpt-oss run: each group's blocks per step as worked
    out above, time-averaged with the steps' durations; the groups' token states add up to the total."""
    r = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096,
                       async_scheduling=False)
    w = r.steps.duration_s.to_numpy()
    full = np.array([_cdiv(1000 + k, 16) for k in range(50)])
    sliding = np.array([63] + [_cdiv(1000 + k, 16) - max(0, 1000 + k - 1 - 127) // 16 for k in range(1, 50)])
    sliding_group, full_group = r.summary["kv"]["groups"]
    assert (sliding_group["kind"], sliding_group["window"], full_group["kind"]) == ("sliding", 128, "full")
    assert sliding_group["mean_blocks"] == pytest.approx((sliding * w).sum() / w.sum(), rel=1e-12)
    assert full_group["mean_blocks"] == pytest.approx((full * w).sum() / w.sum(), rel=1e-12)
    total = r.summary["kv"]["mean_fraction"]
    for part in ("token_states", "reserved", "internal_fragmentation"):
        assert sliding_group["mean_fraction"][part] + full_group["mean_fraction"][part] == pytest.approx(total[part])
    uniform = kvsim.simulate(ONE, model="gpt-oss-20b", gpu="h100-80gb", num_blocks=1000, max_model_len=4096,
                             hybrid_kv_cache=False, async_scheduling=False)
    assert "groups" not in uniform.summary["kv"]


def test_compare_adds_uniform_pages_and_jenga_for_hybrid_models(tmp_path):
    trace, out = tmp_path / "t.jsonl", tmp_path / "c.json"
    trace.write_text("".join(f'{{"arrival_s": {i / 10}, "prompt_tokens": {200 + 50 * i}, "output_tokens": 20}}\n'
                             for i in range(6)))
    res = CliRunner().invoke(app, ["compare", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--max-model-len", "4096", "--kv-gib", "1", "--quiet", "--json", str(out)])
    assert res.exit_code == 0, res.output
    import json
    runs = json.loads(out.read_text())
    assert list(runs) == ["paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle", "static",
                          "paged-uniform", "jenga"]
    assert all(r["requests_finished"] == 6 for r in runs.values())
    res = CliRunner().invoke(app, ["compare", str(trace), "--model", "llama-3-8b", "--kv-gib", "1", "--quiet",
                                   "--json", str(out)])
    assert res.exit_code == 0 and "jenga" not in json.loads(out.read_text())


def test_run_prints_a_row_per_kv_cache_group(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 1000, "output_tokens": 50}\n')
    res = CliRunner().invoke(app, ["run", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--num-blocks", "1000", "--max-model-len", "4096"])
    assert res.exit_code == 0, res.output
    assert "KV group sliding W128" in res.output and "KV group full" in res.output


def test_compare_gives_one_comparable_kv_figure_for_hybrid_models(tmp_path):
    """The allocators' own slots differ in unit for a hybrid model; the capacity row gives vLLM's KV
    tokens at the maximum length for every column. Uniform pages, by hand: gpt-oss-20b holds 24 layers x
    8 KV heads x 64 x 2 (K, V) x 2 bytes = 49,152 B per token: 1 GiB holds 21,845 tokens, 1,365 blocks of
    16, of which vLLM keeps one back as its null block (1,364 x 16 = 21,824 own slots), and vLLM's figure
    1,365 / (4,096 / 16) x 4,096 = 21,840 tokens at 4,096. The hybrid manager's
    figure is `kv_cache_plan`'s (checked against vLLM's own functions in tests/vllm/test_kv_plan.py)."""
    from kvsim.engine.config import kv_cache_plan
    from kvsim.planning.runs import make_config

    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0.0, "prompt_tokens": 200, "output_tokens": 20}\n')
    res = CliRunner().invoke(app, ["compare", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                   "--max-model-len", "4096", "--kv-gib", "1"])
    assert res.exit_code == 0, res.output
    row = next(line for line in res.stdout.splitlines() if "KV tokens at 4,096 (own slots)" in line)
    cells = [c.strip() for c in row.split("│")[2:-1]]
    hybrid = kv_cache_plan(make_config(model="gpt-oss-20b", gpu="h100-80gb", max_model_len=4096, kv_gib=1))
    assert cells[0].startswith(f"{hybrid.capacity_tokens:,} (") and cells[5] == "21,840 (21,824)"
    assert "KV capacity (tokens)" not in res.stdout


def test_prefix_caching_is_on_by_default_for_mamba_hybrids_as_in_vllm():
    """vLLM 0.33 turns prefix caching on for generative hybrid models (`is_prefix_caching_supported`),
    Mamba layers in its "align" mode; kvsim follows under the default profile, but not under Jenga's
    allocator (which does not model align mode), nor when the flag or the profile says off."""
    from kvsim.engine.config import prefix_caching_on
    from kvsim.planning.runs import make_config
    qwen = dict(model="qwen3-next-80b-a3b", gpu="h200", tp=2)
    assert prefix_caching_on(make_config(**qwen))
    assert not prefix_caching_on(make_config(**qwen, allocator="jenga", kv_gib=20.0))
    assert not prefix_caching_on(make_config(**qwen, prefix_caching=False))
    assert not prefix_caching_on(make_config(**qwen, engine_profile="vllm-2023"))
    assert prefix_caching_on(make_config(model="gpt-oss-20b", gpu="h200", allocator="jenga", kv_gib=20.0))


def test_mamba2_layers_export_prefill_checkpoints():
    """vLLM's Mamba-2 mixer declares prefill checkpoint blocks; Mamba-1 (Jamba) and the gated delta net
    (Qwen3-Next, kvsim's A100 path) do not (kvsim/alloc/hybrid/mamba.py)."""
    from pathlib import Path

    from kvsim.specs.kv_groups import exports_prefill_checkpoints as mamba_checkpoints
    from kvsim.specs import get_model
    from kvsim.specs.hf.config import load_hf_config
    assert mamba_checkpoints(get_model("nemotron-h-8b"))
    assert not mamba_checkpoints(get_model("qwen3-next-80b-a3b"))
    jamba = Path(__file__).resolve().parents[1] / "data" / "hf_configs" / "jamba-v0.1.json"
    assert not mamba_checkpoints(load_hf_config(jamba))
    assert not mamba_checkpoints(get_model("gpt-oss-20b"))
