"""The batch limits a run takes without --max-num-seqs / --max-num-batched-tokens: vLLM V1's per-GPU
defaults under vllm-v1 (vllm/engine/arg_utils.py 0.33, `get_batch_defaults` for `vllm serve`:
8192 tokens / 1024 sequences at >= 70 GiB except A100s, 16384 / 1024 at >= 160 GiB, else 2048 / 256;
then a defaulted budget is raised to max_model_len without chunked prefill and capped at
max_num_seqs x max_model_len), and 256 / 8192 on every GPU under vllm-2023 and ideal."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.engine.batching.defaults import batch_limits, tier_defaults
from kvsim.engine.config import SchedulerConfig
from kvsim.planning.reports.ledger import ledger_lines, memory_ledger
from kvsim.planning.runs import config_row, make_config, simulate
from kvsim.specs import GIB
from kvsim.trace.table import Trace


@pytest.mark.parametrize("gpu, expected", [
    ("h100-80gb", (1024, 8192)),        # 79.22 GiB >= 70, not an A100
    ("h200", (1024, 8192)),             # 139.80 GiB < 160
    ("a100-80gb", (256, 2048)),         # 79.25 GiB, but an A100 (vllm-project/vllm#17885)
    ("a100-40gb", (256, 2048)),
    ("l4", (256, 2048)),
])
def test_vllm_v1_defaults_per_gpu_preset(gpu, expected):
    cfg = make_config(model="llama-3-8b", gpu=gpu).resolved()       # 8,192-token maximum length
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_batched_tokens) == expected


def test_the_largest_tier_needs_160_gib():
    assert tier_defaults("vllm-v1", "b200", 160 * GIB) == (16384, 1024)
    assert tier_defaults("vllm-v1", "b200", 160 * GIB - 1) == (8192, 1024)
    assert tier_defaults("vllm-v1", "x", 70 * GIB - 1) == (2048, 256)


@pytest.mark.parametrize("gpu", ["h100-80gb", "a100-40gb"])
def test_ideal_keeps_256_and_8192(gpu):
    cfg = make_config(model="opt-13b", gpu=gpu, engine_profile="ideal").resolved()
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_batched_tokens) == (256, 8192)


@pytest.mark.parametrize("gpu", ["h100-80gb", "a100-40gb"])
def test_vllm_2023_takes_vllm_0_1_defaults(gpu):
    """vLLM 0.1.x's EngineArgs: max_num_seqs 256, max_num_batched_tokens 2560 on every GPU."""
    cfg = make_config(model="opt-13b", gpu=gpu, engine_profile="vllm-2023").resolved()
    assert (cfg.scheduler.max_num_seqs, cfg.scheduler.max_batched_tokens) == (256, 2560)


def test_vllm_adjusts_a_defaulted_budget_to_the_model_length():
    a100 = ("vllm-v1", "a100-40gb", int(39.5 * GIB))
    # no chunked prefill: the budget must hold a whole prompt, max(4096, 2048)
    assert batch_limits(*a100, 4096, chunked_prefill=False) == (256, 4096)
    # a short model: at most 256 x 4 = 1,024 tokens; sequences then min(256, 1024)
    assert batch_limits(*a100, 4, chunked_prefill=True) == (256, 1024)
    # 2 sequences of 2,048 tokens on an H200: min(2 x 2048, 8192) = 4,096
    assert batch_limits("vllm-v1", "h200", int(139.8 * GIB), 2048, True, max_num_seqs=2) == (2, 4096)
    # a budget given is kept, and defaulted sequences are capped by it: min(1024, 100)
    assert batch_limits("vllm-v1", "h200", int(139.8 * GIB), 2048, True, max_batched_tokens=100) == (100, 100)
    # a flag given wins over every default
    assert batch_limits("vllm-v1", "h200", int(139.8 * GIB), 2048, True, 7, 9) == (7, 9)


def test_flags_win_and_the_defaults_follow_a_changed_gpu():
    cfg = make_config(model="llama-3-8b", gpu="a100-40gb", max_num_seqs=64)
    assert cfg.resolved().scheduler.max_num_seqs == 64
    moved = make_config(cfg, gpu="h100-80gb")           # the budget was defaulted: it follows the GPU
    assert moved.batch_limits() == (64, 8192)
    assert config_row(moved)["max_batched_tokens"] == 8192


def test_a_scheduler_built_without_a_gpu_takes_the_fixed_limits():
    assert SchedulerConfig().with_fixed_limits() == SchedulerConfig(256, 8192)
    assert SchedulerConfig(max_num_seqs=3).with_fixed_limits() == SchedulerConfig(3, 8192)


def test_an_h100_admits_more_than_256_sequences_by_default():
    """300 requests of 8 + 4 tokens at t = 0 with room for all: one batch of 300 on an H100 (V1's 1024
    sequences, 8,192 tokens: 2,400 prompt tokens in the first step), 256 on an A100-80GB."""
    trace = Trace.from_arrays([0.0] * 300, [8] * 300, [4] * 300)
    h100 = simulate(trace, model="opt-13b", gpu="h100-80gb", kv_gib=20)
    a100 = simulate(trace, model="opt-13b", gpu="a100-80gb", kv_gib=20)
    assert h100.summary["max_batch_size"] == 300
    assert a100.summary["max_batch_size"] == 256


def test_the_ledger_names_the_limits_and_their_source():
    led = memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb"))
    assert (led["max_num_seqs"], led["max_num_batched_tokens"]) == (1024, 8192)
    assert ledger_lines(led)[0] == ("Scheduler: max_num_seqs=1024, max_num_batched_tokens=8192 "
                                    "(vllm-v1's defaults on h100-80gb)")
    led = memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb", max_num_batched_tokens=512))
    assert led["batch_limits_source"] == "set by --max-num-batched-tokens; the rest vllm-v1's defaults"
    assert led["max_num_seqs"] == 512                   # vLLM: defaulted sequences at most the budget


def test_run_writes_the_limits_it_took(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "traces/tiny.jsonl", "--gpu", "a100-80gb", "--quiet", "--out", str(out)])
    assert res.exit_code == 0, res.output
    sched = json.loads((out / "config.json").read_text())["scheduler"]
    assert (sched["max_num_seqs"], sched["max_batched_tokens"]) == (256, 2048)
