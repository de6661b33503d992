"""Layer kinds in the model spec, config.json reading and the hybrid presets (issue 23, items 1 and 3).

Figures by hand from the config.json values in tests/data/hf_configs and vLLM 0.33's rules
(kvsim/specs/kv_groups.py names the functions); vLLM's own functions check many more cases in
tests/vllm/test_kv_plan.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.specs import GIB, Deployment, get_gpu, get_model
from kvsim.specs.hf.config import load_hf_config
from kvsim.specs.kv_groups import plan_kv_cache
from kvsim.specs.layers import LayerGroup, MambaState
from kvsim.specs.presets import MODELS

CONFIGS = Path(__file__).parents[1] / "data" / "hf_configs"
HYBRID = ("gpt-oss-20b", "gpt-oss-120b", "gemma-3-27b", "llama-4-scout", "deepseek-v3", "qwen3-next-80b-a3b",
          "nemotron-h-8b")


@pytest.mark.parametrize("name", HYBRID)
def test_reading_the_config_gives_the_preset(name):
    read, preset = load_hf_config(CONFIGS / f"{name}.json"), get_model(name)
    assert read.layer_groups == preset.layer_groups
    assert (read.num_layers, read.num_kv_heads, read.head_dim, read.max_seq_len, read.kv_bytes) == \
        (preset.num_layers, preset.num_kv_heads, preset.head_dim, preset.max_seq_len, preset.kv_bytes)
    # parameters are counted from shapes (norms, biases, vision towers left out): within 10 % of the card
    assert read.weight_bytes == pytest.approx(preset.weight_bytes, rel=0.10)


def test_hf_ids_and_old_presets_unchanged():
    assert get_model("openai/gpt-oss-120b").name == "gpt-oss-120b"
    assert get_model("Qwen/Qwen3-Next-80B-A3B-Instruct").name == "qwen3-next-80b-a3b"
    for name, model in MODELS.items():
        assert (name in HYBRID) == bool(model.layer_groups)
    llama = get_model("llama-3-8b")            # 2 x 32 layers x 8 heads x 128 x 2 bytes, as before
    assert not llama.is_hybrid and llama.kv_bytes_per_token(1) == 131072


def test_bytes_per_token_and_per_request_by_hand():
    oss = get_model("gpt-oss-120b")            # 36 layers x 2 x 8 heads x 64 x 2 bytes, full-attention sizing
    assert oss.kv_bytes_per_token(1) == 36 * 2 * 8 * 64 * 2
    assert oss.kv_bytes_per_token(16) == 36 * 2 * 1 * 64 * 2          # 8 heads replicated over 16 GPUs
    ds = get_model("deepseek-v3")              # MLA: 61 x (512 + 64) x 2 bytes on every TP rank
    assert ds.kv_bytes_per_token(1) == ds.kv_bytes_per_token(8) == 61 * 576 * 2
    qn = get_model("qwen3-next-80b-a3b")       # 36 GDN layers: conv 8192 x 3 + state 32 x 128 x 128, bf16
    assert qn.state_bytes_per_request(1) == 36 * (8192 * 3 + 32 * 128 * 128) * 2
    assert qn.state_bytes_per_request(4) == qn.state_bytes_per_request(1) // 4
    nh = get_model("nemotron-h-8b")            # 24 Mamba-2: conv 10240 x 3 bf16 + 128 x 64 x 128 float32
    assert nh.state_bytes_per_request(1) == 24 * (10240 * 3 * 2 + 128 * 64 * 128 * 4)


def test_gpt_oss_figures_by_hand():
    # 16-token page of one layer: 16 x 2 x 8 x 64 x 2 = 32768 B; 18 sliding + 18 full -> 2 groups of 18
    plan = plan_kv_cache(get_model("gpt-oss-120b"), 1, 16, kv_bytes_per_gpu=10**10, max_num_batched_tokens=8192)
    assert plan.bytes_per_block == 18 * 32768 and plan.num_blocks == 10**10 // (18 * 32768) == 16954
    # full: 131072 / 16 = 8192 blocks; sliding: ceil(min(127 + 2 x 8192, 131072) / 16) + 1 = 1033
    assert plan.blocks_per_request == 8192 + 1033
    assert plan.capacity_tokens == int(16954 / 9225 * 131072)
    uniform = plan_kv_cache(get_model("gpt-oss-120b"), 1, 16, kv_bytes_per_gpu=10**10, hybrid=False)
    assert (len(uniform.groups), uniform.num_blocks, uniform.blocks_per_request) == (1, 8477, 8192)
    assert plan.max_concurrency / uniform.max_concurrency == pytest.approx(1.776, abs=1e-3)  # the 1.78x


def test_mamba_block_size_by_hand():
    # Qwen3-Next at TP 1: GDN state 1,097,728 B; attention 2 x 2 x 256 x 2 = 2048 B per token per layer;
    # 16 x ceil(1097728 / (16 x 2048)) = 544 tokens per block (DESIGN.md)
    plan = plan_kv_cache(get_model("qwen3-next-80b-a3b"), 1, 16, kv_bytes_per_gpu=40 * GIB)
    assert plan.block_size == 544 and {g.page_bytes for g in plan.groups} == {544 * 2048}
    assert [g.kind for g in plan.groups] == ["mamba"] * 3 + ["full"]          # 36 / 12 -> 3 + 1 groups
    assert plan.blocks_per_request == 3 + 262144 // 544 + 1
    with pytest.raises(ValueError, match="hybrid KV cache manager"):
        plan_kv_cache(get_model("qwen3-next-80b-a3b"), 1, 16, kv_bytes_per_gpu=40 * GIB, hybrid=False)


def test_jamba_from_attn_layer_period_by_hand():
    # ai21labs/Jamba-v0.1: attention where i % 8 == 4 (4 of 32 layers), Mamba-1 elsewhere: conv 8192 x 3
    # and state 8192 x 16, bf16; MoE on every other layer: 51.6B total, 12.1B active (model card: 52B, 12B)
    jamba = load_hf_config(CONFIGS / "jamba-v0.1.json")
    assert [(g.kind, g.num_layers) for g in jamba.layer_groups] == [("mamba", 28), ("full", 4)]
    assert jamba.state_bytes_per_request(1) == 28 * (8192 * 3 + 8192 * 16) * 2
    assert jamba.num_params == pytest.approx(52e9, rel=0.01) and jamba.active_params == pytest.approx(12e9, rel=0.01)
    # 16 x ceil(311296 B state / (16 x 4096 B per token)) = 80-token blocks; 28 / 4 -> 7 Mamba groups + 1
    plan = plan_kv_cache(jamba, 1, 16, kv_bytes_per_gpu=8 * GIB)
    assert plan.block_size == 80 and len(plan.groups) == 8


def test_chunked_local_attention_is_off_by_default_as_in_vllm():
    scout = get_model("llama-4-scout").with_max_model_len(131072)
    default = plan_kv_cache(scout, 4, 16, kv_bytes_per_gpu=20 * GIB)
    on = plan_kv_cache(scout, 4, 16, kv_bytes_per_gpu=20 * GIB, hybrid=True)
    assert not default.hybrid and "chunked local" in default.note and len(default.groups) == 1
    # 36 chunked + 12 full -> 4 groups of 12; chunked: ceil(min(8192 + 16384, 131072) / 16) = 1536 blocks
    assert len(on.groups) == 4 and on.blocks_per_request == 3 * 1536 + 8192


def test_layer_group_validation():
    with pytest.raises(ValueError, match="unknown kind"):
        LayerGroup("banded", 2, 8, 64)
    with pytest.raises(ValueError, match="window"):
        LayerGroup("sliding", 2, 8, 64)
    with pytest.raises(ValueError, match="window must be >= 1"):
        LayerGroup("sliding", 2, 8, 64, window=0)
    with pytest.raises(ValueError, match="latent_dim"):
        LayerGroup("mla", 2)
    with pytest.raises(ValueError, match="state"):
        LayerGroup("mamba", 2)
    with pytest.raises(ValueError, match="split evenly"):
        MambaState(8192, 4, 32, (128, 128), 2, 2).shapes(3)
    with pytest.raises(ValueError, match="--tp 3"):
        Deployment(get_model("nemotron-h-8b"), get_gpu("h100-80gb"), 3)


def _bad(tmp_path, name: str, change) -> Path:
    cfg = json.loads((CONFIGS / f"{name}.json").read_text())
    change(cfg)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return path


BAD = {
    "unknown layer type": ("gpt-oss-120b", lambda c: c["layer_types"].__setitem__(3, "banded_attention"),
                           "field 'layer_types' has unknown"),
    "sliding window 0": ("gpt-oss-120b", lambda c: c.__setitem__("sliding_window", 0), "field 'sliding_window'"),
    "layer_types length": ("gpt-oss-120b", lambda c: c["layer_types"].pop(), "field 'layer_types' describes 35"),
    "MLA without a rank": ("deepseek-v3", lambda c: c.pop("kv_lora_rank"), "field 'kv_lora_rank' missing"),
    "Mamba state too big": ("nemotron-h-8b", lambda c: c.__setitem__("ssm_state_size", 1 << 20),
                            "field 'ssm_state_size'"),
    "unknown pattern code": ("nemotron-h-8b", lambda c: c.__setitem__("hybrid_override_pattern", "MX" * 26),
                             "field 'hybrid_override_pattern'"),
}


@pytest.mark.parametrize("case", BAD)
def test_bad_config_names_file_and_field(tmp_path, case):
    name, change, message = BAD[case]
    path = _bad(tmp_path, name, change)
    with pytest.raises(ValueError, match=message) as err:
        load_hf_config(path)
    assert str(path) in str(err.value)


def test_cli_bad_config_exits_2(tmp_path):
    path = _bad(tmp_path, "gpt-oss-120b", lambda c: c.__setitem__("sliding_window", 0))
    result = CliRunner().invoke(app, ["capacity", "--model-config", str(path)])
    assert result.exit_code == 2 and "sliding_window" in result.output


def test_cli_capacity_prints_and_writes_vllm_figures(tmp_path):
    out = tmp_path / "c.json"
    args = ["capacity", "--model", "gpt-oss-120b", "--kv-gib", "10", "--max-model-len", "32768",
            "--max-num-batched-tokens", "2048", "--json", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = plan_kv_cache(get_model("gpt-oss-120b").with_max_model_len(32768), 1, 16,
                         kv_bytes_per_gpu=10 * GIB, max_num_batched_tokens=2048)
    paged = json.loads(out.read_text())["static"][0]
    assert (paged["num_blocks"], paged["capacity_tokens"]) == (plan.num_blocks, plan.capacity_tokens)
    assert paged["max_concurrency_at_max_len"] == pytest.approx(plan.max_concurrency)
    assert f"GPU KV cache size: {plan.capacity_tokens:,} tokens" in result.output
    assert "Maximum concurrency for 32,768 tokens per request" in result.output
    uniform = CliRunner().invoke(app, args[:-2] + ["--no-hybrid-kv-cache"])
    # every layer full attention: 10 GiB / (16 x 73728 B) blocks, 2048 per request
    assert f"num_blocks {10 * GIB // (16 * 73728):,}" in uniform.output.replace("\n", " ")


def test_cli_full_attention_figures_unchanged():
    result = CliRunner().invoke(app, ["capacity", "--model", "opt-13b", "--kv-gib", "12"])
    # the hybrid start-up block is not printed (the memory ledger's vLLM lines are, for every model)
    assert result.exit_code == 0 and "hybrid KV cache manager" not in result.output
    assert "15,728" in result.output and "983" in result.output          # the docstring's figures


@pytest.mark.parametrize("fields, expect", [
    # google/gemma-2-9b (no layer_types in its config.json): transformers alternates from a sliding layer 0
    ({"model_type": "gemma2", "num_hidden_layers": 42, "sliding_window": 4096},
     [("sliding", 21, 4096), ("full", 21, None)]),
    # mistralai/Mistral-7B-v0.1: a sliding window and no pattern -> every layer (vLLM CacheConfig.sliding_window)
    ({"model_type": "mistral", "num_hidden_layers": 32, "sliding_window": 4096}, [("sliding", 32, 4096)]),
    # Qwen/Qwen2.5-7B: use_sliding_window false -> the window is ignored, all full attention (no groups)
    ({"model_type": "qwen2", "num_hidden_layers": 28, "sliding_window": 131072, "use_sliding_window": False}, []),
])
def test_sliding_window_without_layer_types(tmp_path, fields, expect):
    cfg = {"hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
           "max_position_embeddings": 8192, "vocab_size": 32000, **fields}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    assert [(g.kind, g.num_layers, g.window) for g in load_hf_config(path).layer_groups] == expect
