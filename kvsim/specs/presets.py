"""The model presets (`get_model`: by preset name or Hugging Face id), with their sources."""

from __future__ import annotations

from kvsim.specs.model import ModelSpec, find_preset
from kvsim.specs.presets_hybrid import HYBRID_HF_IDS, HYBRID_MODELS


def _m(name, layers, hidden, heads, kv_heads, max_len, params, head_dim=128, dtype_bytes=2,
       **moe) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, dtype_bytes, max_len, params, **moe)


#: Shapes from each model's Hugging Face config.json; parameter counts from the model cards. Mixtral's
#: 46.70B total / 12.88B active are what `load_hf_config` counts from its config.json (tests check it).
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _m("opt-13b", 40, 5120, 40, 40, 2048, 12.85e9),
    _m("opt-66b", 64, 9216, 72, 72, 2048, 65.7e9),
    _m("opt-175b", 96, 12288, 96, 96, 2048, 175e9),
    _m("llama-13b", 40, 5120, 40, 40, 2048, 13.0e9),
    _m("llama-2-7b", 32, 4096, 32, 32, 4096, 6.74e9),
    _m("llama-2-13b", 40, 5120, 40, 40, 4096, 13.0e9),
    _m("llama-2-70b", 80, 8192, 64, 8, 4096, 69.0e9),
    _m("llama-3-8b", 32, 4096, 32, 8, 8192, 8.03e9),
    _m("llama-3.1-8b", 32, 4096, 32, 8, 131072, 8.03e9),
    _m("llama-3-70b", 80, 8192, 64, 8, 8192, 70.6e9),
    _m("mistral-7b", 32, 4096, 32, 8, 32768, 7.24e9),
    _m("mixtral-8x7b", 32, 4096, 32, 8, 32768, 46.70e9, active_params=12.88e9, num_experts=8,
       experts_per_token=2),
    _m("qwen2.5-7b", 28, 3584, 28, 4, 32768, 7.62e9),
)} | HYBRID_MODELS

#: Hugging Face ids accepted for the presets (compared case-insensitively), base and chat/instruct
#: variants: the KV and weight figures are the same.
HF_IDS: dict[str, str] = {hf.lower(): name for name, ids in ({
    "opt-13b": ["facebook/opt-13b"], "opt-66b": ["facebook/opt-66b"], "opt-175b": ["facebook/opt-175b"],
    "llama-13b": ["huggyllama/llama-13b"],
    "llama-2-7b": ["meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-7b-chat-hf"],
    "llama-2-13b": ["meta-llama/Llama-2-13b-hf", "meta-llama/Llama-2-13b-chat-hf"],
    "llama-2-70b": ["meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-70b-chat-hf"],
    "llama-3-8b": ["meta-llama/Meta-Llama-3-8B", "meta-llama/Meta-Llama-3-8B-Instruct"],
    "llama-3.1-8b": ["meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                     "meta-llama/Meta-Llama-3.1-8B", "meta-llama/Meta-Llama-3.1-8B-Instruct"],
    "llama-3-70b": ["meta-llama/Meta-Llama-3-70B", "meta-llama/Meta-Llama-3-70B-Instruct"],
    "mistral-7b": ["mistralai/Mistral-7B-v0.1", "mistralai/Mistral-7B-Instruct-v0.1",
                   "mistralai/Mistral-7B-Instruct-v0.2"],
    "mixtral-8x7b": ["mistralai/Mixtral-8x7B-v0.1", "mistralai/Mixtral-8x7B-Instruct-v0.1"],
    "qwen2.5-7b": ["Qwen/Qwen2.5-7B", "Qwen/Qwen2.5-7B-Instruct"],
} | HYBRID_HF_IDS).items() for hf in ids}


def get_model(name: str) -> ModelSpec:
    """The preset named `name` or its Hugging Face id (case-insensitive); ValueError listing the known
    names otherwise."""
    return find_preset(MODELS, HF_IDS.get(name.lower(), name), "model")
