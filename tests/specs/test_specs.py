"""Model and GPU presets, HF config loading, and the KV capacities of the vLLM paper's Table 1."""

import json
import re

import pytest

from kvsim.specs import GIB, Deployment, ModelSpec, get_gpu, get_model
from kvsim.specs.gpu import GPUS
from kvsim.specs.deployment import MAX_CAPACITY_TOKENS, activation_reserve_bytes
from kvsim.specs.presets import MODELS
from kvsim.specs.hf.config import load_hf_config


def test_opt_13b_12_gib_gives_15_7k_slots_at_800_kib_per_token():
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    assert dep.model.kv_bytes_per_token() == 800 * 1024
    assert dep.kv_capacity_tokens(kv_gib=12) == 15728


def test_opt_175b_on_8_gpus_264_gib_gives_60_1k_slots():
    dep = Deployment(get_model("opt-175b"), get_gpu("a100-80gb"), tp=8)
    assert dep.kv_capacity_tokens(kv_gib=264) == 60074
    assert dep.model.kv_bytes_per_token(tp=8) * 8 == dep.model.kv_bytes_per_token()


def test_num_blocks_and_memory_utilisation_sources():
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    assert dep.kv_capacity_tokens(num_blocks=100, block_size=16) == 1600
    # 39.50 GiB (as CUDA reports an A100-40GB) x 0.9 = 38,171,521,843 B, less 25.7e9 B of weights, less
    # 0.5 GiB + 8192 batched tokens x 20 x 5120 x 2 B = 2,214,592,512 B, over 819,200 B per token:
    # 10,256,929,331 / 819,200 = 12,520.7
    assert dep.kv_capacity_tokens() == 12_520
    # the reserve scales with the batched tokens: 2048 tokens keep 1,258,291,200 B less back
    assert dep.kv_capacity_tokens(max_batched_tokens=2048) == 12_520 + 1536


def test_tensor_parallelism_divides_weights_and_kv():
    one = Deployment(get_model("llama-2-70b"), get_gpu("a100-80gb"), tp=4).kv_capacity_tokens()
    two = Deployment(get_model("llama-2-70b"), get_gpu("a100-80gb"), tp=8).kv_capacity_tokens()
    assert two > 2 * one   # doubling GPUs also halves each GPU's weight share


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ValueError, match="unknown model 'gpt-9'; known: opt-13b"):
        get_model("gpt-9")
    with pytest.raises(ValueError, match="unknown GPU"):
        get_gpu("tpu")
    dep = Deployment(get_model("opt-66b"), get_gpu("a100-40gb"))
    with pytest.raises(ValueError, match="weights leave no memory"):
        dep.kv_capacity_tokens()
    with pytest.raises(ValueError, match="not both"):
        dep.kv_capacity_tokens(kv_gib=1, num_blocks=2)
    with pytest.raises(ValueError, match="cannot be split"):
        Deployment(get_model("qwen2.5-7b"), get_gpu("h200"), tp=3)


def test_presets_cover_the_design_names():
    assert {"opt-13b", "opt-66b", "opt-175b", "llama-13b", "llama-2-7b", "llama-2-13b", "llama-2-70b",
            "llama-3-8b", "llama-3-70b", "mistral-7b", "qwen2.5-7b"} <= set(MODELS)
    assert {"a100-40gb", "a100-80gb", "h100-80gb", "h200", "l4", "a10g"} <= set(GPUS)
    assert get_model("Llama-3-8B").num_kv_heads == 8


def test_hf_config_llama_style(tmp_path):
    cfg = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
           "num_key_value_heads": 8, "max_position_embeddings": 8192, "intermediate_size": 14336,
           "vocab_size": 128256, "torch_dtype": "bfloat16", "_name_or_path": "meta-llama/Meta-Llama-3-8B"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    spec = load_hf_config(path)
    assert spec.kv_bytes_per_token() == get_model("llama-3-8b").kv_bytes_per_token() == 131072
    assert spec.num_params == pytest.approx(8.03e9, rel=0.01)


def test_hf_config_errors_name_the_file_and_field(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 10}))
    with pytest.raises(ValueError, match=r"config.json: field 'num_hidden_layers' missing"):
        load_hf_config(path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="cannot read model config"):
        load_hf_config(path)


@pytest.mark.parametrize("kwargs, message", [
    ({"kv_gib": float("inf")}, "--kv-gib must be positive and finite, got inf"),
    ({"kv_gib": float("nan")}, "--kv-gib must be positive and finite, got nan"),
    ({"kv_gib": 1e30}, "--kv-gib 1e+30: 1.31e+33 KV token slots is more than kvsim models"),
    ({"num_blocks": 10**17}, "--num-blocks 100000000000000000 x --block-size 16: 1.6e+18 KV token slots"),
])
def test_absurd_capacities_are_refused_naming_the_flag(kwargs, message):
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    with pytest.raises(ValueError, match=re.escape(message)):
        dep.kv_capacity_tokens(**kwargs)


def test_largest_capacity_is_accepted():
    dep = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
    assert dep.kv_capacity_tokens(kv_gib=1e9) == 1e9 * 2**30 // 819200
    assert dep.kv_capacity_tokens(num_blocks=2**46, block_size=16) == MAX_CAPACITY_TOKENS


def test_kv_heads_are_replicated_when_tp_exceeds_them():
    # llama-3-8b: 32 query heads, 8 KV heads, 32 layers x 128 dims x 2 bytes x K and V = 16 KiB per head
    model = get_model("llama-3-8b")
    assert [model.kv_bytes_per_token(tp) for tp in (1, 2, 8, 16, 32)] == \
        [8 * 16384, 4 * 16384, 16384, 16384, 16384]             # each GPU keeps one whole KV head
    gpu = get_gpu("h100-80gb")
    # 16 GiB of KV over the deployment: tp <= 8 splits the heads (2^17 bytes per token in all);
    # tp 16 holds each head twice, tp 32 four times
    assert [Deployment(model, gpu, tp).kv_capacity_tokens(kv_gib=16) for tp in (1, 8, 16, 32)] == \
        [131072, 131072, 65536, 32768]
    # by memory: each GPU's KV memory / 16 KiB, so tp 16 and 32 gain only the weights they shed
    capacities = [Deployment(model, gpu, tp).kv_capacity_tokens() for tp in (8, 16, 32)]
    reserve = activation_reserve_bytes(model, 8192)
    assert capacities == [int((gpu.memory_bytes * 0.9 - model.weight_bytes / tp - reserve) / 16384)
                          for tp in (8, 16, 32)]
    assert capacities == [4435369, 4496633, 4527265]   # not doubling with tp


@pytest.mark.parametrize("model, tp, message", [
    ("opt-13b", 1000, "--tp 1000: opt-13b's 40 attention heads cannot be split evenly over 1000 GPUs"),
    ("llama-3-8b", 64, "--tp 64: llama-3-8b's 32 attention heads cannot be split evenly"),
    ("llama-2-7b", 3, "(tp must divide 32)"),
])
def test_tp_must_divide_the_attention_heads(model, tp, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        Deployment(get_model(model), get_gpu("a100-80gb"), tp)


def test_tp_must_split_or_replicate_kv_heads_evenly():
    odd = ModelSpec("odd", num_layers=2, hidden_size=768, num_heads=12, num_kv_heads=4, head_dim=64,
                    dtype_bytes=2, max_seq_len=512, num_params=1e8)
    Deployment(odd, get_gpu("l4"), 4)
    Deployment(odd, get_gpu("l4"), 12)      # 12 = 3 x 4: each KV head on 3 GPUs
    with pytest.raises(ValueError, match=re.escape("--tp 6: odd's 4 KV heads can be neither split evenly "
                                                   "nor replicated evenly over 6 GPUs")):
        Deployment(odd, get_gpu("l4"), 6)
