"""A `ModelSpec` from a Hugging Face `config.json`: dense and MoE shapes, and quantized weights.

Parameters are counted from the shapes (attention, MLP or experts, router, embeddings; norms and
biases are left out, under 0.1 %). A MoE model's weights count every expert; its active parameters
(what one token computes with) count `num_experts_per_tok` routed experts plus the shared ones.
Quantized checkpoints (`quantization_config`) store the linear layers in fewer bytes and keep the
embeddings and LM head in the model dtype. Units: parameters and bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.files import read_json_object
from kvsim.specs.hf.checks import TEXT_MODEL_TYPE, check_fields
from kvsim.specs.hf.layers import layer_groups, layer_kinds, mixer_params
from kvsim.specs.model import ModelSpec

_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}

#: quant_method -> bytes per weight when the config gives no bit width (fp8 variants store one byte;
#: MXFP4, gpt-oss's experts: 4-bit values plus one 8-bit scale per 32 weights = 4.25 bits).
_FIXED_BYTES = {"fp8": 1.0, "fbgemm_fp8": 1.0, "modelopt": 1.0, "mxfp4": 4 / 8 + 1 / 32}
#: Integer methods with `bits` and `group_size`: each group of g weights also stores an fp16 scale and
#: a `bits`-wide zero point, so bytes per weight = bits / 8 + (2 + bits / 8) / g (g = -1: per channel).
_GROUPED = ("awq", "gptq", "awq_marlin", "gptq_marlin", "marlin")


def weight_bytes_per_param(quant: dict, where: str) -> float:
    """Bytes per quantized weight for a `quantization_config` (fp8, int8, int4 awq/gptq, bitsandbytes,
    compressed-tensors); ValueError naming the field for anything else."""
    method = str(quant.get("quant_method", "")).lower()
    if method in _FIXED_BYTES:
        return _FIXED_BYTES[method]
    if method == "bitsandbytes":
        for key in ("load_in_4bit", "load_in_8bit"):
            if quant.get(key) is not None and not isinstance(quant[key], bool):
                raise ValueError(f"{where}: quantization_config.{key} must be true or false, got "
                                 f"{json.dumps(quant[key])}")
        return 0.5 if quant.get("load_in_4bit") else 1.0
    if method in _GROUPED:
        bits = _quant_int(quant, ("bits", "w_bit"), 4, 1, where)
        group = _quant_int(quant, ("group_size", "q_group_size"), 128, -1, where)   # -1: one group per row
        if group == 0:
            key = "group_size" if "group_size" in quant else "q_group_size"
            raise ValueError(f"{where}: quantization_config.{key} must be -1 (per channel) or >= 1, got 0")
        return bits / 8 + ((2 + bits / 8) / group if group > 0 else 0.0)
    if method == "compressed-tensors":
        groups = quant.get("config_groups") or {}
        for name, group in groups.items():
            weights = group.get("weights") or {}
            if "num_bits" in weights:
                path = f"quantization_config.config_groups.{name}.weights"
                return _quant_int(weights, ("num_bits",), 8, 1, where, path) / 8
        raise ValueError(f"{where}: quantization_config.config_groups has no weights.num_bits")
    known = ", ".join([*_FIXED_BYTES, "bitsandbytes", *_GROUPED, "compressed-tensors"])
    raise ValueError(f"{where}: quantization_config.quant_method {method!r} is not known; known: {known}")


def _quant_int(quant: dict, keys: tuple[str, ...], default: int, low: int, where: str,
               path: str = "quantization_config") -> int:
    """The first of `keys` present in `quant` (else `default`) as an int >= `low`; ValueError naming it."""
    key = next((k for k in keys if k in quant), None)
    if key is None:
        return default
    value = quant[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{where}: {path}.{key} must be an integer >= {low}, got {value!r}")
    return value


def _text_config(cfg: dict, path: Path) -> dict:
    """The language model's config: a multimodal wrapper's `text_config` (Gemma 3, Llama 4), with the
    wrapper's dtype, quantization and name where it does not give its own."""
    text = cfg.get("text_config")
    if text is None:
        return cfg
    if not isinstance(text, dict):
        raise ValueError(f"{path}: field 'text_config' must be an object")
    inherited = ("torch_dtype", "dtype", "quantization_config", "_name_or_path")
    text = {**{k: cfg[k] for k in inherited if k in cfg}, **text}
    if not isinstance(cfg.get("model_type", ""), str):
        raise ValueError(f"{path}: field 'model_type' must be a string, got {json.dumps(cfg['model_type'])}")
    wrapped = TEXT_MODEL_TYPE.get(cfg.get("model_type"))   # the class transformers builds it as
    if wrapped is not None and text.get("model_type") is None:
        text["model_type"] = wrapped
    elif wrapped is not None and text["model_type"] != wrapped:
        raise ValueError(f"{path}: field 'text_config.model_type' must be {wrapped!r} in a "
                         f"{cfg['model_type']!r} config, got {json.dumps(text['model_type'])}")
    return {**_TEXT_DEFAULTS.get(str(text.get("model_type")), {}), **text}


#: transformers' defaults for fields a multimodal checkpoint's text_config leaves out
#: (Gemma3TextConfig: max_position_embeddings 131072, vocab_size 262208, tied embeddings).
_TEXT_DEFAULTS = {"gemma3_text": {"max_position_embeddings": 131072, "vocab_size": 262208,
                                  "tie_word_embeddings": True}}


def load_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` (or a folder holding one): LLaMA/Mistral/Qwen,
    Mixtral and Qwen-MoE, OPT key names, and the layer kinds of `kvsim.specs.hf.layers` (sliding
    window, chunked local, MLA, Mamba / linear attention; a nested `text_config`)."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    cfg = _text_config(read_json_object(path, "model config"), path)
    check_fields(cfg, path)

    def need(*keys):
        for key in keys:
            if cfg.get(key) is not None:
                return int(cfg[key])
        raise ValueError(f"{path}: field {keys[0]!r} missing or null in the model config (also read as: "
                         f"{', '.join(keys[1:])})")

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or cfg.get("attention_head_dim") or hidden // heads)
    if cfg.get("kv_lora_rank") is not None:                # MLA: the query/key head is nope + rope wide
        head_dim = int(cfg.get("qk_nope_head_dim") or 0) + int(cfg.get("qk_rope_head_dim") or 0) or head_dim
    max_len = need("max_position_embeddings", "n_positions", "max_seq_len")
    dtype_bytes = _dtype_bytes(cfg, path)
    if "head_dim" not in cfg and "attention_head_dim" not in cfg and hidden % heads:
        raise ValueError(f"{path}: field 'hidden_size' ({hidden}) must be divisible by the attention heads "
                         f"({heads}) when no head_dim is given")
    if heads % kv_heads:
        raise ValueError(f"{path}: field 'num_attention_heads' ({heads}) must be a multiple of "
                         f"'num_key_value_heads' ({kv_heads})")
    vocab = int(cfg["vocab_size"]) if cfg.get("vocab_size") is not None else 32000
    tied = bool(cfg.get("tie_word_embeddings", cfg.get("model_type") == "opt"))

    kinds = layer_kinds(cfg, path, layers)
    groups = layer_groups(cfg, path, layers, kv_heads, head_dim, hidden, dtype_bytes)
    attention = _attention_params(cfg, hidden, heads, kv_heads, head_dim)
    mixers = sum(mixer_params(cfg, kind, hidden, attention) for kind in kinds)
    ffn = int(cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden)
    gated = "intermediate_size" in cfg and cfg.get("model_type") != "nemotron_h"   # relu2: up + down
    mats = 3 if gated else 2                               # gated MLP (LLaMA) vs fc1/fc2 (OPT)
    dense_mlp = mats * hidden * ffn
    mlp_layers = kinds.count("none") if cfg.get("model_type") == "nemotron_h" else layers
    experts = int(cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0)
    per_token = int(cfg.get("num_experts_per_tok") or 0) if experts else 0
    if experts:
        expert = 3 * hidden * int(cfg.get("moe_intermediate_size") or ffn)
        shared_ffn = int(cfg.get("shared_expert_intermediate_size")
                         or int(cfg.get("n_shared_experts") or 0) * int(cfg.get("moe_intermediate_size") or ffn))
        shared = 3 * hidden * shared_ffn + (hidden if "shared_expert_intermediate_size" in cfg else 0)
        router = hidden * experts
        dense_layers = min(int(cfg.get("first_k_dense_replace") or 0), mlp_layers)
        if cfg.get("expert_layer_period"):                 # Jamba: MoE where i % period == offset
            period, offset = int(cfg["expert_layer_period"]), int(cfg.get("expert_layer_offset") or 0)
            dense_layers = sum(i % period != offset for i in range(mlp_layers))
        moe_layers = mlp_layers - dense_layers
        expert_params = moe_layers * experts * expert
        total_layers = mixers + dense_layers * dense_mlp + moe_layers * (experts * expert + router + shared)
        active_layers = mixers + dense_layers * dense_mlp + moe_layers * (per_token * expert + router + shared)
    else:
        expert_params = 0
        total_layers = active_layers = mixers + mlp_layers * dense_mlp
    embeddings = vocab * hidden * (1 if tied else 2)
    params, active = total_layers + embeddings, active_layers + embeddings

    quant = cfg.get("quantization_config")
    wbytes = None
    if quant is not None:
        if not isinstance(quant, dict):
            raise ValueError(f"{path}: field 'quantization_config' must be an object")
        try:
            wbytes = weight_bytes_per_param(quant, str(path))
        except (TypeError, AttributeError, ZeroDivisionError) as exc:
            raise ValueError(f"{path}: field 'quantization_config' is malformed ({exc})") from None
    unquantized = float(embeddings) if wbytes is not None else 0.0
    if wbytes is not None and str(quant.get("quant_method", "")).lower() == "mxfp4":
        unquantized = float(params - expert_params)        # MXFP4 quantizes the experts only
    name = _model_name(cfg, path)
    return ModelSpec(str(name), layers, hidden, heads, kv_heads, head_dim, dtype_bytes, max_len,
                     float(params), active_params=float(active) if experts else None,
                     num_experts=experts, experts_per_token=per_token, weight_bytes_per_param=wbytes,
                     unquantized_params=unquantized, layer_groups=groups,
                     quant_method=str(quant.get("quant_method", "")).lower() if wbytes is not None else None)


def _dtype_bytes(cfg: dict, path: Path) -> int:
    """Bytes per weight of the config's `torch_dtype` (or `dtype`; default float16); ValueError naming
    the field for a type kvsim does not know (e.g. "int4", which is a quantization, not a dtype)."""
    key = "torch_dtype" if cfg.get("torch_dtype") is not None else "dtype"
    value = cfg.get(key)
    if value is None:
        return 2
    dtype = value.replace("torch.", "") if isinstance(value, str) else None
    if dtype not in _DTYPE_BYTES:
        raise ValueError(f"{path}: field {key!r} must be one of {', '.join(_DTYPE_BYTES)}, got "
                         f"{json.dumps(value)}")
    return _DTYPE_BYTES[dtype]


def _attention_params(cfg: dict, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    """Weights of one attention layer: Q, K, V, O projections; MLA's low-rank projections (DeepSeek:
    q_a/q_b or q, kv_a to kv_lora_rank + qk_rope_head_dim, kv_b, o)."""
    rank = cfg.get("kv_lora_rank")
    if rank is None:
        return 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    rope, nope = int(cfg.get("qk_rope_head_dim") or 0), int(cfg.get("qk_nope_head_dim") or 0)
    v_dim, q_rank = int(cfg.get("v_head_dim") or nope), int(cfg.get("q_lora_rank") or 0)
    q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
    return q + hidden * (rank + rope) + rank * heads * (nope + v_dim) + heads * v_dim * hidden


def _model_name(cfg: dict, path: Path) -> str:
    """The model's name: the config's own `_name_or_path`, else the file's name when it is not the generic
    `config.json` (`qwen3-8b.json` -> `qwen3-8b`), else the folder a Hugging Face download puts it in
    when that names a model, else the config's architecture (`LlamaForCausalLM`): a folder such as
    `cfg` or `hf_configs` names no model."""
    if cfg.get("_name_or_path"):
        return str(cfg["_name_or_path"])
    if path.stem.lower() != "config":
        return path.stem
    arch = cfg.get("architectures")
    arch = str(arch[0]) if isinstance(arch, list) and arch else str(cfg.get("model_type") or "")
    folder = path.resolve().parent.name
    return folder if any(c.isdigit() for c in folder) and "-" in folder else (arch or folder or path.stem)
