"""Layer kinds from a Hugging Face config.json, as vLLM 0.33 derives them per model family.

- `layer_types` ("full_attention", "sliding_attention", "chunked_attention", "linear_attention",
  "mamba", "attention", "mlp", "moe"); when absent, transformers' defaults: gpt_oss alternates
  sliding / full from layer 0 (vLLM gpt_oss.py), gemma2/gemma3_text/cohere2 are full where (i + 1) %
  `sliding_window_pattern` (default 2/6/4) == 0, qwen3_next full where (i + 1) % `full_attention_interval`
  (default 4) == 0, llama4_text full (NoPE) where `no_rope_layers[i]` == 0 (default: every 4th layer)
  and chunked local (`attention_chunk_size`, default 8192) elsewhere;
- Mamba hybrids: `hybrid_override_pattern` / `layers_block_type` (Nemotron-H: M Mamba-2, * attention,
  - MLP, E MoE), `attn_layer_period` / `attn_layer_offset` (Jamba: Mamba-1 elsewhere), granitemoehybrid
  `layer_types`; Mamba-2 state from `mamba_num_heads`/`mamba_n_heads`, `mamba_head_dim`/`mamba_d_head`,
  `n_groups`/`mamba_n_groups`, `ssm_state_size`/`mamba_d_state`, `conv_kernel`/`mamba_d_conv`; gated
  delta net (Qwen3-Next) from the `linear_*` fields; SSM state dtype from `mamba_ssm_cache_dtype`
  (Nemotron-H default float32, vLLM NemotronHForCausalLMConfig; else the model dtype);
- MLA (DeepSeek-V2/V3, Kimi K2): `kv_lora_rank` + `qk_rope_head_dim` values per token per layer;
- a `sliding_window` with no per-layer pattern applies to every layer (vLLM's CacheConfig.sliding_window),
  unless `use_sliding_window` is false.
Anything else that would change the KV memory is a ValueError naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

from kvsim.specs.layers import LayerGroup, MambaState

_TYPE_NAMES = {"full_attention": "full", "attention": "full", "sliding_attention": "sliding",
               "chunked_attention": "chunked", "linear_attention": "mamba", "mamba": "mamba", "mlp": "none",
               "moe": "none"}
_PATTERN = {"M": "mamba", "*": "full", "-": "none", "E": "none"}
#: transformers' default `sliding_window_pattern` (layer i is full when (i + 1) % n == 0) per model type.
_SLIDING_PATTERN = {"gemma3_text": 6, "gemma3": 6, "gemma2": 2, "cohere2": 4}
#: Qwen3-Next's gated delta net fields (any one of them means the linear-attention state).
_GDN = ("linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim")
_SSM_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "auto": None}
#: The largest GPU memory kvsim knows (h200, bytes): one request's Mamba state must fit it.
MAX_GPU_BYTES = int(139.80 * 1024**3)


def _int(cfg: dict, key: str, path: Path, default: int | None = None, low: int = 1) -> int:
    value = cfg.get(key, default)
    if type(value) is not int or value < low:
        raise ValueError(f"{path}: field {key!r} must be an integer >= {low}, got {value!r}")
    return value


def _first(cfg: dict, keys: tuple[str, ...], path: Path, default: int | None = None) -> int:
    key = next((k for k in keys if cfg.get(k) is not None), None)
    if key is None and default is None:
        raise ValueError(f"{path}: field {keys[0]!r} missing (or one of its names: {', '.join(keys[1:])})")
    return _int(cfg, key or keys[0], path, default)


def layer_kinds(cfg: dict, path: Path, num_layers: int) -> list[str]:
    """One kind per decoder layer: full, sliding, chunked, mla, mamba or none (an MLP-only layer)."""
    model_type = str(cfg.get("model_type", ""))
    if cfg.get("kv_lora_rank") is not None:
        return ["mla"] * num_layers
    field = "layer_types" if cfg.get("layer_types") is not None else "layers_block_type"
    types = cfg.get(field)                  # an empty list is a list of no layers (transformers' check)
    if types is None and cfg.get("hybrid_override_pattern") is not None:
        pattern, field = cfg["hybrid_override_pattern"], "hybrid_override_pattern"
        bad = sorted(set(str(pattern)) - set(_PATTERN))
        if not isinstance(pattern, str) or bad:
            raise ValueError(f"{path}: field 'hybrid_override_pattern' has unknown layer codes {bad}; known: "
                             f"{', '.join(_PATTERN)}")
        kinds = [_PATTERN[c] for c in pattern]
    elif types is not None:
        if not isinstance(types, list) or not all(isinstance(t, str) for t in types):
            raise ValueError(f"{path}: field {field!r} must be a list of strings")
        unknown = sorted({t for t in types if t not in _TYPE_NAMES})
        if unknown:
            raise ValueError(f"{path}: field {field!r} has unknown layer type(s) {unknown}; known: "
                             f"{', '.join(_TYPE_NAMES)}")
        kinds = [_TYPE_NAMES[t] for t in types]
    elif cfg.get("attn_layer_period") is not None:
        period, offset = _int(cfg, "attn_layer_period", path), _int(cfg, "attn_layer_offset", path, 0, 0)
        if offset >= period:                   # transformers' JambaConfig: offset < period
            raise ValueError(f"{path}: field 'attn_layer_offset' ({offset}) must be less than "
                             f"'attn_layer_period' ({period}): no layer would be attention")
        field = "attn_layer_period"
        kinds = ["full" if i % period == offset else "mamba" for i in range(num_layers)]
    elif model_type == "gpt_oss":
        kinds = ["sliding" if i % 2 == 0 else "full" for i in range(num_layers)]
    elif model_type in _SLIDING_PATTERN or cfg.get("sliding_window_pattern") is not None:
        n = _int(cfg, "sliding_window_pattern", path, _SLIDING_PATTERN.get(model_type))
        field = "sliding_window_pattern"
        kinds = ["full" if (i + 1) % n == 0 else "sliding" for i in range(num_layers)]
    elif model_type == "qwen3_next" or cfg.get("full_attention_interval") is not None:
        n, field = _int(cfg, "full_attention_interval", path, 4), "full_attention_interval"
        kinds = ["full" if (i + 1) % n == 0 else "mamba" for i in range(num_layers)]
    elif model_type == "llama4_text":
        flags = cfg.get("no_rope_layers") or [int((i + 1) % 4 != 0) for i in range(num_layers)]  # [] too
        if not isinstance(flags, list) or any(type(f) is not int or f not in (0, 1) for f in flags):
            raise ValueError(f"{path}: field 'no_rope_layers' must be a list of 0 (NoPE, full attention) "
                             "and 1 (RoPE, chunked) per layer")
        chunked = not ("attention_chunk_size" in cfg and cfg["attention_chunk_size"] is None)  # null: all full
        kinds = ["chunked" if f and chunked else "full" for f in flags]
        field = "no_rope_layers"
    elif cfg.get("sliding_window") is not None and cfg.get("use_sliding_window") is not False:
        kinds = ["sliding"] * num_layers
    else:
        kinds = ["full"] * num_layers
    if len(kinds) != num_layers:
        raise ValueError(f"{path}: field {field!r} describes {len(kinds)} layers, but the model has "
                         f"{num_layers} (num_hidden_layers)")
    if not set(kinds) & {"full", "sliding", "chunked", "mla"}:
        raise ValueError(f"{path}: field {field!r} leaves no attention layer among the {num_layers}: a pure "
                         "state-space model, which kvsim does not serve (it models Mamba layers only beside "
                         "attention layers)")
    return kinds


def _mamba_state(cfg: dict, path: Path, dtype_bytes: int, hidden: int) -> MambaState:
    """A Mamba layer's state: gated delta net (`linear_*`), Mamba-2 or Mamba-1 (Jamba) fields."""
    model_type = str(cfg.get("model_type", ""))
    if model_type == "qwen3_next" or any(cfg.get(k) is not None for k in _GDN):   # gated delta net
        nk, nv = _int(cfg, "linear_num_key_heads", path), _int(cfg, "linear_num_value_heads", path)
        dk, dv = _int(cfg, "linear_key_head_dim", path), _int(cfg, "linear_value_head_dim", path)
        return MambaState(2 * nk * dk + nv * dv, _int(cfg, "linear_conv_kernel_dim", path), nv, (dv, dk),
                          dtype_bytes, dtype_bytes)
    ssm_default = "float32" if model_type == "nemotron_h" else "auto"
    ssm_name = str(cfg.get("mamba_ssm_cache_dtype") or ssm_default)
    if ssm_name not in _SSM_DTYPE_BYTES:
        raise ValueError(f"{path}: field 'mamba_ssm_cache_dtype' {ssm_name!r} is not known; known: "
                         f"{', '.join(_SSM_DTYPE_BYTES)}")
    ssm_bytes = _SSM_DTYPE_BYTES[ssm_name] or dtype_bytes
    state = _first(cfg, ("ssm_state_size", "mamba_d_state", "state_size"), path)
    kernel = _first(cfg, ("conv_kernel", "mamba_d_conv"), path)
    heads_key = next((k for k in ("mamba_num_heads", "mamba_n_heads") if cfg.get(k) is not None), None)
    if heads_key is None:                                          # Mamba-1 (Jamba)
        inner = _first(cfg, ("mamba_expand", "expand"), path) * hidden
        return MambaState(inner, kernel, inner, (state,), dtype_bytes, ssm_bytes)
    heads = _int(cfg, heads_key, path)
    head_dim = _first(cfg, ("mamba_head_dim", "mamba_d_head"), path)
    groups = _first(cfg, ("n_groups", "mamba_n_groups"), path, 1)
    inner = heads * head_dim                    # nemotron_h.py; granitemoehybrid.py: mamba_expand x hidden
    if model_type == "granitemoehybrid":
        inner = _int(cfg, "mamba_expand", path) * hidden
    return MambaState(inner + 2 * groups * state, kernel, heads, (head_dim, state), dtype_bytes,
                      ssm_bytes, groups, state)


def layer_groups(cfg: dict, path: Path, num_layers: int, kv_heads: int, head_dim: int, hidden: int,
                 dtype_bytes: int) -> tuple[LayerGroup, ...]:
    """The layers that keep a cache, by kind; () for an all-full-attention model (kvsim's default)."""
    kinds = layer_kinds(cfg, path, num_layers)
    if all(k == "full" for k in kinds):
        return ()
    window = chunk = None
    if "sliding" in kinds:
        window = cfg.get("sliding_window")
        if type(window) is not int or window < 1:
            raise ValueError(f"{path}: field 'sliding_window' must be an integer >= 1 for sliding-window "
                             f"layers, got {window!r}")
    if "chunked" in kinds:
        chunk = _int(cfg, "attention_chunk_size", path, 8192 if cfg.get("model_type") == "llama4_text" else None)
    state = _mamba_state(cfg, path, dtype_bytes, hidden) if "mamba" in kinds else None
    if state is not None and kinds.count("mamba") * state.bytes_per_gpu(1) > MAX_GPU_BYTES:
        field = next(k for k in ("linear_num_value_heads", "ssm_state_size", "mamba_d_state", "state_size")
                     if cfg.get(k) is not None)
        raise ValueError(f"{path}: field {field!r}: one request's Mamba state "
                         f"({kinds.count('mamba') * state.bytes_per_gpu(1) / 1024**3:.3g} GiB) leaves no room "
                         "on any known GPU")
    latent = 0
    if "mla" in kinds:
        latent = _int(cfg, "kv_lora_rank", path) + _int(cfg, "qk_rope_head_dim", path)
    groups = []
    for kind in dict.fromkeys(k for k in kinds if k != "none"):
        n = kinds.count(kind)
        if kind == "mla":
            groups.append(LayerGroup("mla", n, latent_dim=latent))
        elif kind == "mamba":
            groups.append(LayerGroup("mamba", n, state=state))
        else:
            groups.append(LayerGroup(kind, n, kv_heads, head_dim, window=window if kind == "sliding" else None,
                                     chunk=chunk if kind == "chunked" else None))
    return tuple(groups)


def mixer_params(cfg: dict, kind: str, hidden: int, attention: int) -> int:
    """Weights of one layer's token mixer: `attention` for attention and MLA layers, the Mamba-2 /
    Mamba-1 / gated-delta-net projections for Mamba layers, none for MLP-only layers (norms left out)."""
    if kind == "none":
        return 0
    if kind != "mamba":
        return attention
    if cfg.get("linear_num_value_heads") is not None:
        nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
        kd, vd = nk * cfg["linear_key_head_dim"], nv * cfg["linear_value_head_dim"]
        return hidden * (2 * kd + 2 * vd) + hidden * 2 * nv + vd * hidden      # qkvz, ba, out
    state = next(cfg[k] for k in ("ssm_state_size", "mamba_d_state", "state_size") if cfg.get(k) is not None)
    heads = cfg.get("mamba_num_heads") or cfg.get("mamba_n_heads")
    if heads is None:                                                         # Mamba-1
        inner = (cfg.get("mamba_expand") or cfg.get("expand")) * hidden
        dt_rank = -(-hidden // 16)
        return hidden * 2 * inner + inner * (dt_rank + 2 * state) + dt_rank * inner + inner * hidden
    inner = heads * (cfg.get("mamba_head_dim") or cfg.get("mamba_d_head"))
    groups = cfg.get("n_groups") or cfg.get("mamba_n_groups") or 1
    return hidden * (2 * inner + 2 * groups * state + heads) + inner * hidden
