"""Field-by-field checks of a Hugging Face `config.json`, before `kvsim.specs.hf.config` reads a shape.

Every field kvsim reads is checked for its JSON type and range here, with the rules transformers and vLLM
apply, so a defect is one line naming the file and the field instead of a different answer:
- integers (`INT_FIELDS`): a JSON integer (not 32.0, "32", true or NaN) in [low, high]; null means absent
  where transformers has a default. The ceilings bound what kvsim builds per layer or per expert, far
  above released models (cited at each);
- MoE: a config that routes tokens (`num_experts_per_tok` >= 1) has >= 1 experts and top-k <= experts
  (transformers' MixtralConfig / DeepseekV3Config; vLLM's FusedMoE needs both);
- MLA: fields of multi-head latent attention (`qk_rope_head_dim`, `qk_nope_head_dim`) need a
  `kv_lora_rank` (DeepseekV3Config: the cache holds rank + rope values per token);
- booleans and names (`tie_word_embeddings`, `use_sliding_window`, `model_type`);
- a pure state-space model (`PURE_SSM`: no attention layer at all) is refused by name: kvsim models
  attention KV caches, with Mamba layers only beside attention (vLLM's hybrid KV cache manager).
Patterns (which layer is what) are checked where they are read (`kvsim.specs.hf.layers`).
"""

from __future__ import annotations

import json
from pathlib import Path

#: Most decoder layers (a per-layer list is built): Llama-3.1-405B has 126, the deepest released ~200.
MAX_LAYERS = 4096
#: Widest hidden size, head dim, rank or MLP width: Llama-3.1-405B's hidden 16,384 and MLP 53,248.
MAX_DIM = 2**20
#: Most attention or KV heads (Llama-3.1-405B: 128).
MAX_HEADS = 2**16
#: Largest vocabulary (Gemma 3: 262,208).
MAX_VOCAB = 2**24
#: Longest context or window, tokens (Llama 4 Scout: 10,485,760).
MAX_POSITIONS = 2**30
#: Most routed experts (Kimi K2: 384; Qwen3-Next: 512).
MAX_EXPERTS = 2**16

_POSITIONS = ("max_position_embeddings", "n_positions", "max_seq_len", "attention_chunk_size", "sliding_window")
_DIMS = ("hidden_size", "n_embd", "d_model", "head_dim", "attention_head_dim", "kv_lora_rank",
         "qk_rope_head_dim", "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim",
         "linear_value_head_dim", "linear_conv_kernel_dim", "ssm_state_size", "mamba_d_state", "state_size",
         "conv_kernel", "mamba_d_conv", "mamba_expand", "expand", "mamba_num_heads", "mamba_n_heads",
         "mamba_head_dim", "mamba_d_head", "n_groups", "mamba_n_groups")
_WIDTHS = ("intermediate_size", "ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size",
           "q_lora_rank", "qk_nope_head_dim", "v_head_dim")
_LAYER_INDEX = ("sliding_window_pattern", "full_attention_interval", "attn_layer_period",
                "expert_layer_period")

#: field -> (lowest, highest) JSON integer.
INT_FIELDS: dict[str, tuple[int, int]] = {
    **{k: (1, MAX_LAYERS) for k in ("num_hidden_layers", "n_layer", "num_layers", *_LAYER_INDEX)},
    **{k: (0, MAX_LAYERS) for k in ("first_k_dense_replace", "attn_layer_offset", "expert_layer_offset")},
    **{k: (1, MAX_HEADS) for k in ("num_attention_heads", "n_head", "num_key_value_heads")},
    **{k: (1, MAX_DIM) for k in _DIMS},
    **{k: (0, MAX_DIM) for k in _WIDTHS},
    **{k: (1, MAX_POSITIONS) for k in _POSITIONS},
    "vocab_size": (1, MAX_VOCAB),
    **{k: (0, MAX_EXPERTS) for k in ("num_local_experts", "num_experts", "n_routed_experts",
                                     "num_experts_per_tok", "n_shared_experts")},
}
EXPERT_FIELDS = ("num_local_experts", "num_experts", "n_routed_experts")
#: model_type of pure state-space models (no attention layer): transformers' Mamba, Mamba-2,
#: FalconMamba and RWKV configs.
PURE_SSM = ("mamba", "mamba2", "falcon_mamba", "rwkv", "rwkv6", "rwkv7", "xlstm")


def check_fields(cfg: dict, path: Path) -> None:
    """ValueError naming `path` and the field for the first field whose type or range is wrong."""
    model_type = cfg.get("model_type")
    if model_type is not None and not isinstance(model_type, str):
        raise ValueError(f"{path}: field 'model_type' must be a string, got {json.dumps(model_type)}")
    if model_type in PURE_SSM:
        raise ValueError(f"{path}: field 'model_type' {model_type!r} is a pure state-space model (no attention "
                         "layer): kvsim models attention KV caches, with Mamba layers only beside attention "
                         "layers, and does not serve it")
    for key, (low, high) in INT_FIELDS.items():
        value = cfg.get(key)
        if value is not None and (type(value) is not int or not low <= value <= high):
            raise ValueError(f"{path}: field {key!r} must be an integer in [{low:,}, {high:,}], got "
                             f"{json.dumps(value)}")
    for key in ("tie_word_embeddings", "use_sliding_window"):
        if cfg.get(key) is not None and not isinstance(cfg[key], bool):
            raise ValueError(f"{path}: field {key!r} must be true or false, got {json.dumps(cfg[key])}")
    _check_moe(cfg, path)
    if cfg.get("kv_lora_rank") is None:
        for key in ("qk_rope_head_dim", "qk_nope_head_dim", "q_lora_rank"):
            if cfg.get(key) is not None:
                raise ValueError(f"{path}: field 'kv_lora_rank' missing or null: {key!r} describes multi-head "
                                 "latent attention, whose cache size is the rank")


def _check_moe(cfg: dict, path: Path) -> None:
    top_k = cfg.get("num_experts_per_tok") or 0
    key = next((k for k in EXPERT_FIELDS if cfg.get(k) is not None), None)
    experts = cfg[key] if key is not None else 0
    if top_k >= 1 and experts == 0:
        name = key or next((k for k in EXPERT_FIELDS if k in cfg), None)
        what = f"field {name!r} is {json.dumps(cfg.get(name))}" if name else \
            "no expert count (" + ", ".join(EXPERT_FIELDS) + ")"
        raise ValueError(f"{path}: {what}; a MoE model (num_experts_per_tok {top_k}) needs >= 1 experts")
    if experts and not 1 <= top_k <= experts:
        raise ValueError(f"{path}: field 'num_experts_per_tok' must be in [1, {experts}] for a MoE model "
                         f"({key} {experts}), got {json.dumps(cfg.get('num_experts_per_tok'))}")


#: The language model's model_type a multimodal wrapper builds its `text_config` as when the
#: text_config names none (transformers: Llama4Config -> Llama4TextConfig, Gemma3Config -> Gemma3TextConfig).
TEXT_MODEL_TYPE = {"llama4": "llama4_text", "gemma3": "gemma3_text"}
