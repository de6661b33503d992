"""Presets of the models served in 2025-26 whose layers are not all full attention: sliding window
(gpt-oss, Gemma 3), chunked local (Llama 4), multi-head latent attention (DeepSeek-V3) and linear
attention / Mamba (Qwen3-Next, Nemotron-H). Every shape is its Hugging Face config.json's (repo id
cited); parameter counts are the model cards' (or technical reports'). tests/data/hf_configs/ holds
the same config.json fields and tests/specs/test_hybrid.py checks that reading them gives these specs.
"""

from __future__ import annotations

from kvsim.specs.layers import LayerGroup, MambaState
from kvsim.specs.model import ModelSpec

#: MXFP4 (OCP microscaling): 4-bit values plus one 8-bit scale per 32 -> 4.25 bits = 0.53125 bytes.
MXFP4_BYTES_PER_PARAM = 4 / 8 + 1 / 32


def _gpt_oss(name: str, layers: int, experts: int, params: float, active: float, mlp_params: float) -> ModelSpec:
    # openai/gpt-oss-{20b,120b} config.json: hidden_size 2880, num_attention_heads 64,
    # num_key_value_heads 8, head_dim 64, max_position_embeddings 131072, experts_per_token 4,
    # sliding_window 128, layer_types alternating sliding_attention / full_attention from layer 0
    # (vLLM gpt_oss.py: sliding when layer_idx % 2 == 0); MXFP4 experts, bf16 elsewhere
    # (quantization_config.modules_to_not_convert: attention, router, embeddings, lm_head).
    half = layers // 2
    return ModelSpec(name, layers, 2880, 64, 8, 64, 2, 131072, params, active_params=active,
                     num_experts=experts, experts_per_token=4, weight_bytes_per_param=MXFP4_BYTES_PER_PARAM,
                     unquantized_params=params - mlp_params,
                     layer_groups=(LayerGroup("sliding", half, 8, 64, window=128), LayerGroup("full", half, 8, 64)))


HYBRID_MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    # gpt-oss model card (OpenAI, 2025) table 1: 20b 20.91B total (MLP 19.12B), 3.61B active;
    # 120b 116.83B total (MLP 114.71B), 5.13B active.
    _gpt_oss("gpt-oss-20b", 24, 32, 20.91e9, 3.61e9, 19.12e9),
    _gpt_oss("gpt-oss-120b", 36, 128, 116.83e9, 5.13e9, 114.71e9),
    # google/gemma-3-27b-it config.json text_config: num_hidden_layers 62, hidden_size 5376,
    # num_attention_heads 32, num_key_value_heads 16, head_dim 128, sliding_window 1024; defaults
    # (transformers Gemma3TextConfig): max_position_embeddings 131072, sliding_window_pattern 6 (layer i
    # is full when (i + 1) % 6 == 0: 10 full, 52 sliding). Gemma 3 report table 1: 417M vision +
    # 1,416M embedding + 25,600M non-embedding = 27.43B parameters, bf16.
    ModelSpec("gemma-3-27b", 62, 5376, 32, 16, 128, 2, 131072, 27.43e9,
              layer_groups=(LayerGroup("sliding", 52, 16, 128, window=1024), LayerGroup("full", 10, 16, 128))),
    # meta-llama/Llama-4-Scout-17B-16E-Instruct config.json text_config: num_hidden_layers 48,
    # hidden_size 5120, num_attention_heads 40, num_key_value_heads 8, head_dim 128,
    # attention_chunk_size 8192, no_rope_layers [] (transformers' default: every 4th layer is NoPE,
    # i.e. global attention; vLLM llama4.py: the others use chunked local attention), 16 experts, top 1,
    # max_position_embeddings 10485760. Model card: 109B total, 17B active, bf16.
    ModelSpec("llama-4-scout", 48, 5120, 40, 8, 128, 2, 10485760, 109e9, active_params=17e9,
              num_experts=16, experts_per_token=1,
              layer_groups=(LayerGroup("chunked", 36, 8, 128, chunk=8192), LayerGroup("full", 12, 8, 128))),
    # deepseek-ai/DeepSeek-V3 config.json: num_hidden_layers 61, hidden_size 7168, num_attention_heads
    # 128, num_key_value_heads 128, kv_lora_rank 512, qk_rope_head_dim 64 (MLA latent 576 values per
    # token per layer), qk_nope_head_dim 128, max_position_embeddings 163840, n_routed_experts 256,
    # num_experts_per_tok 8, fp8 weights (quantization_config quant_method fp8), embeddings and lm_head
    # bf16 (vocab_size 129280 x 7168 x 2). Model card: 671B total (without the 14B MTP module), 37B active.
    ModelSpec("deepseek-v3", 61, 7168, 128, 128, 192, 2, 163840, 671e9, active_params=37e9,
              num_experts=256, experts_per_token=8, weight_bytes_per_param=1.0,
              unquantized_params=2 * 129280 * 7168, layer_groups=(LayerGroup("mla", 61, latent_dim=576),)),
    # Qwen/Qwen3-Next-80B-A3B-Instruct config.json: num_hidden_layers 48, full_attention_interval 4
    # (12 full + 36 linear_attention), hidden_size 2048, num_attention_heads 16, num_key_value_heads 2,
    # head_dim 256, max_position_embeddings 262144, num_experts 512, num_experts_per_tok 10; gated
    # delta net: linear_num_key_heads 16, linear_num_value_heads 32, linear_key_head_dim 128,
    # linear_value_head_dim 128, linear_conv_kernel_dim 4 (conv dim 2 x 16 x 128 + 32 x 128 = 8192;
    # state 32 heads x 128 x 128; bf16, vLLM's mamba_ssm_cache_dtype "auto"). Model card: 80B total, 3B active.
    ModelSpec("qwen3-next-80b-a3b", 48, 2048, 16, 2, 256, 2, 262144, 80e9, active_params=3e9,
              num_experts=512, experts_per_token=10,
              layer_groups=(LayerGroup("mamba", 36, state=MambaState(8192, 4, 32, (128, 128), 2, 2)),
                            LayerGroup("full", 12, 2, 256))),
    # nvidia/Nemotron-H-8B-Base-8K config.json: num_hidden_layers 52, hybrid_override_pattern
    # "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-" (24 Mamba-2, 4 attention, 24 MLP-only),
    # hidden_size 4096, num_attention_heads 32, num_key_value_heads 8, head_dim 128,
    # max_position_embeddings 8192; Mamba-2: mamba_num_heads 128, mamba_head_dim 64, n_groups 8,
    # ssm_state_size 128, conv_kernel 4 (conv dim 128 x 64 + 2 x 8 x 128 = 10240); SSM state float32
    # (vLLM NemotronHForCausalLMConfig: mamba_ssm_cache_dtype "float32" by default), conv state bf16.
    # 8.1B parameters counted from these shapes (the model card's "8B").
    ModelSpec("nemotron-h-8b", 52, 4096, 32, 8, 128, 2, 8192, 8.1e9,
              layer_groups=(LayerGroup("mamba", 24, state=MambaState(10240, 4, 128, (64, 128), 2, 4, 8, 128)),
                            LayerGroup("full", 4, 8, 128))),
)}

HYBRID_HF_IDS: dict[str, list[str]] = {
    "gpt-oss-20b": ["openai/gpt-oss-20b"],
    "gpt-oss-120b": ["openai/gpt-oss-120b"],
    "gemma-3-27b": ["google/gemma-3-27b-it", "google/gemma-3-27b-pt"],
    "llama-4-scout": ["meta-llama/Llama-4-Scout-17B-16E-Instruct", "meta-llama/Llama-4-Scout-17B-16E"],
    "deepseek-v3": ["deepseek-ai/DeepSeek-V3", "deepseek-ai/DeepSeek-V3-0324", "deepseek-ai/DeepSeek-R1"],
    "qwen3-next-80b-a3b": ["Qwen/Qwen3-Next-80B-A3B-Instruct", "Qwen/Qwen3-Next-80B-A3B-Thinking"],
    "nemotron-h-8b": ["nvidia/Nemotron-H-8B-Base-8K"],
}
