"""vLLM's CPU offload as it runs it (`--cpu-kv-policy store-all`: every computed block stored) beside the
eviction tier, and data + expert parallelism (`--data-parallel-size`, `--enable-expert-parallel`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.cost.v1_time import V1CostModel
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.planning.runs import make_config
from kvsim.specs import Deployment, GpuSpec, ModelSpec, get_gpu, get_model
from kvsim.trace.table import Trace

ROOT = Path(__file__).resolve().parents[2]
GPU = GpuSpec("toy-gpu", 10**10, 1e12, 1e15, 1e10, 0.0, "nvlink", 1e11)
# 8 experts of 1e8 parameters, top-2, 0.5e8 dense: 8.5e8 in all, 2.5e8 active
MOE = ModelSpec("moe-dp", 2, 64, 4, 4, 16, 2, 4096, 8.5e8, active_params=2.5e8, num_experts=8, experts_per_token=2)


@pytest.mark.parametrize("policy, stored", [("store-all", 2), ("evicted", 0)])
def test_store_all_keeps_every_computed_block(policy, stored):
    # one prompt of 33 tokens at block 16: 2 full prompt blocks computed, nothing evicted
    trace = Trace.from_arrays([0.0], [33], [2], block_hashes=[[11, 12]], hash_block_size=16)
    cfg = SimConfig(Deployment(get_model("llama-2-7b"), get_gpu("h100-80gb")),
                    CacheConfig(cpu_kv_gib=1.0, cpu_kv_policy=policy), SchedulerConfig())
    cpu = simulate(trace, cfg).summary["cpu_kv"]
    assert cpu["stored_blocks"] == stored and cpu["dropped_blocks"] == 0
    assert cpu["stored_bytes"] == stored * 16 * 524288          # Llama-2-7B: 512 KiB of K and V per token


def test_bad_cpu_kv_policy():
    with pytest.raises(ValueError, match="--cpu-kv-policy must be evicted or store-all, got 'all'"):
        CacheConfig(cpu_kv_policy="all")


def test_expert_parallel_weights_per_gpu():
    plain = Deployment(MOE, GPU, 1, 2)
    ep = Deployment(MOE, GPU, 1, 2, ep=True)
    assert ep.expert_weight_bytes == 8 * 1e8 * 2
    assert plain.weight_bytes_per_gpu() == 8.5e8 * 2                      # every GPU holds it all
    assert ep.weight_bytes_per_gpu() == pytest.approx(0.5e8 * 2 + 8e8 * 2 / 2)   # dense + half the experts
    assert Deployment(MOE, GPU, 2, 2, ep=True).weight_bytes_per_gpu() == pytest.approx(0.5e8 + 8e8 * 2 / 4)
    with pytest.raises(ValueError, match="has 8 experts, fewer than the 16 GPUs"):
        Deployment(MOE, GPU, 1, 16, ep=True)
    with pytest.raises(ValueError, match="--data-parallel-size 0: must be a whole number from 1 to 1,024"):
        Deployment(MOE, GPU, 1, 0)


def test_expert_parallel_time_terms():
    m = V1CostModel(Deployment(MOE, GPU, 1, 2, ep=True), 16)
    # each GPU reads its half of the experts the 2 engines' tokens touch (1 token each: 2 x top-2 routes)
    touched = 8 * (1 - 0.75 ** 2)
    assert m.weights_time(1) == pytest.approx((0.5e8 * 2 + touched * 1e8 * 2 / 2) / 0.8e12)
    # one exchange per MoE layer over the 2 GPUs: 3 tokens padded to 4, x 2 engines x 64 x 2 bytes
    assert m.all_reduce_time(3) == pytest.approx(2 * (5.5e-6 + 1024 / 0.8e11))
    assert V1CostModel(Deployment(MOE, GPU, 1, 2), 16).all_reduce_time(3) == 0.0


def test_vllm_flags_set_dp_and_ep():
    cfg = make_config(model="mixtral-8x7b", gpu="h100-80gb", data_parallel_size=2, enable_expert_parallel=True)
    assert (cfg.deployment.dp, cfg.deployment.ep) == (2, True)


def test_run_with_data_parallel_engines(tmp_path):
    out = tmp_path / "s.json"
    res = CliRunner().invoke(app, ["run", str(ROOT / "traces" / "tiny.jsonl"), "--model", "mixtral-8x7b", "--gpu",
                                   "h100-80gb", "--data-parallel-size", "2", "--enable-expert-parallel", "--quiet",
                                   "--json", str(out)])
    assert res.exit_code == 0, res.output
    summary = json.loads(out.read_text())
    assert summary["fleet"]["replicas"] == 2 and summary["fleet"]["router"] == "least-requests"
    assert summary["requests_finished"] == summary["requests_total"]


def test_the_qwen3_30b_a3b_dp2_ep_run_replays():
    """The development set's DP 2 + EP run (real-runs/, shipped): two engines, experts split in two."""
    from kvsim.validation.measured import read_run
    from kvsim.validation.replay import simulate_run
    folder = ROOT / "real-runs" / "rtxpro6000-qwen3-30b-a3b-instruct-2507-llmservingsim"
    if not folder.exists():
        pytest.skip(f"{folder} is absent")
    pred, figures, (cfg, trace, _, result) = simulate_run(read_run(folder))
    dep = cfg.deployment
    assert (dep.tp, dep.dp, dep.ep, dep.gpu.name) == (1, 2, True, "rtx-pro-6000")
    assert result.summary["fleet"]["replicas"] == 2 and sum(result.summary["fleet"]["routed"]) == len(trace)
    # 128 experts of 48 layers x 3 x 2048 x 768 parameters each, bf16: half of them on each GPU
    experts = 128 * 48 * 3 * 2048 * 768 * 2
    assert dep.expert_weight_bytes == pytest.approx(experts, rel=0.01)
    assert dep.weight_bytes_per_gpu() == pytest.approx(dep.model.weight_bytes - dep.expert_weight_bytes / 2)
