"""MoE and quantized model configs, KV-cache dtype, --max-model-len, Hugging Face ids and folders:
parameter and capacity figures computed by hand in the comments."""

import json

import pytest

from kvsim.specs import GIB, Deployment, get_gpu, get_model
from kvsim.specs.deployment import activation_reserve_bytes
from kvsim.specs.hf.config import load_hf_config

LLAMA3_8B = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 8, "max_position_embeddings": 8192, "intermediate_size": 14336,
             "vocab_size": 128256, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
MIXTRAL = {**LLAMA3_8B, "vocab_size": 32000, "max_position_embeddings": 32768,
           "num_local_experts": 8, "num_experts_per_tok": 2, "_name_or_path": "mistralai/Mixtral-8x7B-v0.1"}


def write(tmp_path, cfg, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(cfg))
    return path


def test_mixtral_counts_every_expert_in_weights_and_two_in_compute(tmp_path):
    spec = load_hf_config(write(tmp_path, MIXTRAL))
    # per layer: attention 2 x 4096^2 + 2 x 4096 x 1024 = 41,943,040; expert 3 x 4096 x 14336 =
    # 176,160,768; router 4096 x 8 = 32,768; embeddings 2 x 32000 x 4096 = 262,144,000
    assert spec.num_params == 32 * (41_943_040 + 8 * 176_160_768 + 32_768) + 262_144_000 == 46_702_526_464
    assert spec.active_params == 32 * (41_943_040 + 2 * 176_160_768 + 32_768) + 262_144_000 == 12_879_659_008
    assert spec.compute_params == spec.active_params
    assert (spec.num_experts, spec.experts_per_token) == (8, 2)
    assert spec.weight_bytes == 2 * 46_702_526_464
    preset = get_model("mixtral-8x7b")
    assert preset.num_params == pytest.approx(spec.num_params, rel=1e-3)
    assert preset.active_params == pytest.approx(spec.active_params, rel=1e-3)
    assert preset.kv_bytes_per_token() == spec.kv_bytes_per_token() == 131_072


def test_mixtral_capacity_on_two_h100s(tmp_path):
    dep = Deployment(load_hf_config(write(tmp_path, MIXTRAL)), get_gpu("h100-80gb"), tp=2)
    # per GPU: 79.22 GiB (85,061,827,297 B) x 0.9 = 76,555,644,567.3 B, less half of 93,405,052,928 B
    # of weights, less 0.5 GiB + 8192 x 20 x 4096 x 2 B = 1,879,048,192 B: 27,974,069,911.3 B;
    # x 2 GPUs / 131,072 B per token = 426,850.4
    assert dep.kv_capacity_tokens() == 426_850


def test_qwen_moe_counts_shared_experts(tmp_path):
    cfg = {"num_hidden_layers": 24, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 16,
           "max_position_embeddings": 8192, "intermediate_size": 5632, "moe_intermediate_size": 1408,
           "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
           "vocab_size": 151936, "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    spec = load_hf_config(write(tmp_path, cfg))
    attention = 4 * 2048 * 2048                    # 16,777,216
    expert = 3 * 2048 * 1408                       # 8,650,752
    shared = 3 * 2048 * 5632 + 2048                # 34,605,056 (with the shared expert's gate)
    router = 2048 * 60                             # 122,880
    emb = 2 * 151936 * 2048                        # 622,329,856
    # 24 x 570,550,272 + emb and 24 x 86,108,160 + emb: the model card's "14.3B, 2.7B activated"
    assert spec.num_params == 24 * (attention + 60 * expert + router + shared) + emb == 14_315_536_384
    assert spec.active_params == 24 * (attention + 4 * expert + router + shared) + emb == 2_688_925_696


def test_fp8_and_int4_weights_shrink_and_embeddings_stay_bf16(tmp_path):
    dense = load_hf_config(write(tmp_path, LLAMA3_8B))
    # layers 32 x 218,103,808 = 6,979,321,856; embeddings 2 x 128256 x 4096 = 1,050,673,152
    assert dense.num_params == 8_029_995_008 and dense.weight_bytes == 2 * 8_029_995_008
    fp8 = load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": {"quant_method": "fp8"}}))
    assert fp8.weight_bytes == 6_979_321_856 * 1 + 1_050_673_152 * 2 == 9_080_668_160
    awq = load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": {
        "quant_method": "awq", "bits": 4, "group_size": 128}}))
    # 4 bits + (fp16 scale + 4-bit zero) per 128 weights = 0.5 + 2.5 / 128 = 0.51953125 B per weight
    assert awq.weight_bytes == pytest.approx(6_979_321_856 * 0.51953125 + 1_050_673_152 * 2)
    int8 = load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": {
        "quant_method": "compressed-tensors", "config_groups": {"g0": {"weights": {"num_bits": 8}}}}}))
    assert int8.weight_bytes == fp8.weight_bytes
    assert int8.compute_params == dense.num_params     # quantization does not change the FLOPs
    # capacity on one H100: 76,555,644,567.3 B - 9,080,668,160 B - 1,879,048,192 B = 65,595,928,215.3 B
    # over 131,072 B per token = 500,457.2
    assert Deployment(fp8, get_gpu("h100-80gb")).kv_capacity_tokens() == 500_457
    with pytest.raises(ValueError, match=r"config.json: quantization_config.quant_method 'hqq' is not known"):
        load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": {"quant_method": "hqq"}}))


@pytest.mark.parametrize("quant, field", [
    ({"quant_method": "gptq", "bits": "four"}, "quantization_config.bits"),
    ({"quant_method": "awq", "w_bit": 0}, "quantization_config.w_bit"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 12.5}, "quantization_config.group_size"),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": None}}}},
     "quantization_config.config_groups.g.weights.num_bits"),
])
def test_malformed_quantization_numbers_name_their_field(tmp_path, quant, field):
    with pytest.raises(ValueError, match=rf"config.json: {field} must be an integer >= "):
        load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": quant}))


def test_gptq_group_size_minus_one_means_no_group_scales(tmp_path):
    gptq = load_hf_config(write(tmp_path, {**LLAMA3_8B, "quantization_config": {
        "quant_method": "gptq", "bits": 4, "group_size": -1}}))
    assert gptq.weight_bytes == 6_979_321_856 // 2 + 1_050_673_152 * 2   # 0.5 B per layer weight


def test_kv_cache_dtype_fp8_doubles_the_slots():
    spec = get_model("llama-3-8b")
    fp8 = spec.with_kv_cache_dtype("fp8")
    assert fp8.kv_bytes_per_token() == 65_536 and spec.kv_bytes_per_token() == 131_072
    assert spec.with_kv_cache_dtype("auto") == spec and spec.with_kv_cache_dtype("BF16").kv_bytes == 2
    dep, dep8 = Deployment(spec, get_gpu("h100-80gb")), Deployment(fp8, get_gpu("h100-80gb"))
    assert dep8.kv_capacity_tokens(kv_gib=10) == 2 * dep.kv_capacity_tokens(kv_gib=10) == 163_840
    assert fp8.weight_bytes == spec.weight_bytes
    with pytest.raises(ValueError, match="--kv-cache-dtype: unknown 'int3'"):
        spec.with_kv_cache_dtype("int3")


def test_max_model_len_overrides_and_is_bounded():
    spec = get_model("llama-3.1-8b")
    assert spec.max_seq_len == 131_072
    assert spec.with_max_model_len(8192).max_seq_len == 8192
    assert spec.with_max_model_len(None) is spec
    with pytest.raises(ValueError, match=r"--max-model-len must be in \[1, 131072\]"):
        spec.with_max_model_len(200_000)


@pytest.mark.parametrize("hf_id, preset", [
    ("meta-llama/Meta-Llama-3-8B", "llama-3-8b"), ("meta-llama/Meta-Llama-3-8B-Instruct", "llama-3-8b"),
    ("META-LLAMA/meta-llama-3-8b", "llama-3-8b"), ("facebook/opt-13b", "opt-13b"),
    ("meta-llama/Llama-3.1-8B-Instruct", "llama-3.1-8b"), ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b"),
])
def test_hugging_face_ids_are_preset_aliases(hf_id, preset):
    assert get_model(hf_id) == get_model(preset)


def test_model_config_may_be_a_folder(tmp_path):
    write(tmp_path, LLAMA3_8B)
    assert load_hf_config(tmp_path).kv_bytes_per_token() == 131_072
    with pytest.raises(ValueError, match="cannot read model config"):
        load_hf_config(tmp_path / "nothing-here")


def test_activation_reserve_matches_vllm_profile_of_llama_3_8b():
    # vllm-project/vllm#10511: 1.26 GiB activation peak for Llama-3-8B at 8192 batched tokens
    spec = get_model("llama-3-8b")
    activations = activation_reserve_bytes(spec, 8192) - activation_reserve_bytes(spec, 0)
    assert activations / GIB == pytest.approx(1.26, abs=0.02)
