"""Hugging Face configs checked field by field (issue 40, family 2): each defect the issue lists ends in
one ValueError naming the file and the field (the CLI: exit 2), and a property test mutates every shipped
config (delete, null, wrong type, zero, negative, NaN, huge, wrong length) and asserts either such a
refusal or a model whose KV bytes per token and weight bytes lie within bounds worked out here from the
mutated config itself (not from kvsim's code).

Default suite: 150 generated examples; `pytest --long`: the long profile's 5,000.
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from typer.testing import CliRunner

from kvsim.specs.hf.config import load_hf_config

ROOT = Path(__file__).resolve().parents[3]
SHIPPED = sorted((ROOT / "tests" / "data" / "hf_configs").glob("*.json")) + sorted(
    p for p in (ROOT / "kvsim").rglob("*.json") if "model_type" in p.read_text()[:4000])
CONFIGS = {p.stem: json.loads(p.read_text()) for p in SHIPPED}


def _write(tmp: Path, cfg: dict) -> Path:
    path = tmp / "config.json"
    path.write_text(json.dumps(cfg))
    return path


def _refused(tmp: Path, cfg: dict, field: str) -> str:
    path = _write(tmp, cfg)
    with pytest.raises(ValueError) as err:
        load_hf_config(path)
    message = str(err.value)
    assert str(path) in message and field in message, message
    return message


def _mutated(name: str, key: str, value, text: bool = False) -> dict:
    cfg = copy.deepcopy(CONFIGS[name])
    (cfg["text_config"] if text else cfg)[key] = value
    return cfg


# --- the cases the issue lists: each passed silently (or crashed) before ---------------------------------

@pytest.mark.parametrize("name,key", [("deepseek-v3", "n_routed_experts"), ("gpt-oss-20b", "num_local_experts"),
                                      ("qwen3-next-80b-a3b", "num_experts")])
def test_moe_with_zero_experts_is_refused(tmp_path, name, key):
    _refused(tmp_path, _mutated(name, key, 0), key)


def test_moe_with_its_expert_count_deleted_is_refused(tmp_path):
    cfg = copy.deepcopy(CONFIGS["deepseek-v3"])
    del cfg["n_routed_experts"]
    _refused(tmp_path, cfg, "n_routed_experts")


def test_kv_lora_rank_null_is_refused(tmp_path):
    _refused(tmp_path, _mutated("deepseek-v3", "kv_lora_rank", None), "kv_lora_rank")


def test_kv_lora_rank_huge_names_the_field_and_its_ceiling(tmp_path):
    message = _refused(tmp_path, _mutated("deepseek-v3", "kv_lora_rank", 10**9), "kv_lora_rank")
    assert "1,048,576" in message


def test_empty_layer_types_is_refused(tmp_path):
    _refused(tmp_path, _mutated("gpt-oss-20b", "layer_types", []), "layer_types")


def test_no_rope_layers_entries_must_be_0_or_1(tmp_path):
    layers = CONFIGS["llama-4-scout"]["text_config"]["num_hidden_layers"]
    _refused(tmp_path, _mutated("llama-4-scout", "no_rope_layers", [2] * layers, text=True), "no_rope_layers")


def test_text_config_without_model_type_is_built_as_the_wrapper_builds_it(tmp_path):
    cfg = copy.deepcopy(CONFIGS["llama-4-scout"])
    del cfg["text_config"]["model_type"]
    spec = load_hf_config(_write(tmp_path, cfg))
    kinds = {g.kind: g.num_layers for g in spec.layer_groups}
    assert kinds == {"chunked": 36, "full": 12}         # transformers' default: every 4th layer NoPE/full
    assert spec.layer_groups == load_hf_config(SHIPPED[[p.stem for p in SHIPPED].index("llama-4-scout")]).layer_groups


@pytest.mark.parametrize("name,key,value", [("qwen3-next-80b-a3b", "full_attention_interval", 49),
                                            ("jamba-v0.1", "attn_layer_offset", 8)])
def test_hybrid_without_attention_layer_is_refused(tmp_path, name, key, value):
    _refused(tmp_path, _mutated(name, key, value), key)


@pytest.mark.parametrize("command", ["run", "compare", "capacity"])
def test_cli_hybrid_without_attention_exits_2_naming_the_field(tmp_path, command):
    from kvsim.cli.app import app
    path = _write(tmp_path, _mutated("qwen3-next-80b-a3b", "full_attention_interval", 49))
    args = [command, *([str(ROOT / "traces" / "tiny.jsonl")] if command != "capacity" else []),
            "--model-config", str(path), "--gpu", "h200", "--tp", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "full_attention_interval" in result.output and "internal error" not in result.output


def test_pure_state_space_model_is_refused_by_name(tmp_path):
    cfg = {"model_type": "mamba2", "hidden_size": 2560, "num_hidden_layers": 64, "vocab_size": 50288,
           "state_size": 128, "num_heads": 80, "head_dim": 64}
    message = _refused(tmp_path, cfg, "model_type")
    assert "pure state-space" in message
    _refused(tmp_path, _mutated("nemotron-h-8b", "hybrid_override_pattern",
                                "M-" * (CONFIGS["nemotron-h-8b"]["num_hidden_layers"] // 2)), "hybrid_override_pattern")


# --- the property test -----------------------------------------------------------------------------------

_DTYPE = {"float16": 2, "bfloat16": 2, "float32": 4}
_MUTATIONS = ["delete", None, "x", [1], {}, 0, -1, float("nan"), 10**12, 1.5, True, "short", "long"]


def _apply(cfg: dict, where: str | None, key: str, how) -> dict:
    cfg = copy.deepcopy(cfg)
    target = cfg[where] if where else cfg
    if how == "delete":
        target.pop(key, None)
    elif how in ("short", "long"):
        value = target.get(key)
        if isinstance(value, list):
            target[key] = value[:-1] if how == "short" else value + value[-1:]
        elif isinstance(value, str):
            target[key] = value[:-1] if how == "short" else value + value[-1:]
        else:
            target[key] = [] if how == "short" else [value, value]
    else:
        target[key] = how
    return cfg


def _text(cfg: dict) -> dict:
    inner = cfg.get("text_config")
    return {**cfg, **inner} if isinstance(inner, dict) else cfg


def _bounds(cfg: dict) -> tuple[tuple[float, float], tuple[float, float]]:
    """(KV bytes per token low/high, weight bytes low/high) from the config's own fields: every layer at
    most one attention layer's K and V (or MLA's latent), at least one; weights at least the embedding
    table and at most 16 bytes-worth of every weight a layer can hold."""
    c = _text(cfg)
    layers, hidden, heads = c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"]
    kv_heads = c.get("num_key_value_heads") or heads
    head_dim = c.get("head_dim") or hidden // heads
    b = _DTYPE.get(str(c.get("torch_dtype") or c.get("dtype") or "float16").replace("torch.", ""), 1)
    if c.get("kv_lora_rank") is not None:
        exact = layers * (c["kv_lora_rank"] + c["qk_rope_head_dim"]) * b
        kv = (exact, exact)
    else:
        layer = 2 * kv_heads * head_dim * b
        kv = (layer, layer * layers)
    experts = max(c.get(k) or 0 for k in ("num_local_experts", "num_experts", "n_routed_experts"))
    widths = [hidden, heads * head_dim, *(c.get(k) or 0 for k in (
        "intermediate_size", "ffn_dim", "moe_intermediate_size", "shared_expert_intermediate_size", "kv_lora_rank",
        "q_lora_rank"))]
    widths += [(c.get("mamba_expand") or c.get("expand") or 0) * hidden,
               (c.get("mamba_num_heads") or c.get("mamba_n_heads") or 0) * (c.get("mamba_head_dim") or 64),
               (c.get("linear_num_value_heads") or 0) * (c.get("linear_value_head_dim") or 0) * 2]
    vocab = c.get("vocab_size") or 32000
    low = vocab * hidden * 0.5
    high = 4 * (2 * vocab * hidden + layers * 16 * hidden * max(widths) * (experts + 3))
    return kv, (low, high)


_CASES = [(name, where, key) for name, cfg in CONFIGS.items()
          for where, part in ((None, cfg), ("text_config", cfg.get("text_config") or {}))
          for key in part if key != "text_config"]


@settings(max_examples=max(150, settings.default.max_examples), deadline=None, suppress_health_check=list(HealthCheck))
@given(case=st.sampled_from(_CASES), how=st.sampled_from(_MUTATIONS))
def test_every_mutation_is_refused_by_field_or_sized_within_bounds(tmp_path_factory, case, how):
    from kvsim.specs import Deployment, get_gpu
    name, where, key = case
    cfg = _apply(CONFIGS[name], where, key, how)
    path = _write(tmp_path_factory.mktemp("cfg"), cfg)
    try:
        spec = load_hf_config(path)
        kv_per_token = Deployment(spec, get_gpu("h200"), 1).kv_bytes_per_token()
    except ValueError as exc:
        message = str(exc)
        assert str(path) in message and key in message, f"{key} <- {how!r}: {message}"
        return
    (kv_low, kv_high), (w_low, w_high) = _bounds(cfg)
    assert kv_low <= kv_per_token <= kv_high, (key, how, kv_per_token, kv_low, kv_high)
    assert math.isfinite(spec.weight_bytes) and w_low <= spec.weight_bytes <= w_high, (key, how, spec.weight_bytes)


def test_the_bounds_hold_for_every_shipped_config():
    from kvsim.specs import Deployment, get_gpu
    assert len(CONFIGS) >= 8
    for name, cfg in CONFIGS.items():
        spec = load_hf_config(SHIPPED[[p.stem for p in SHIPPED].index(name)])
        (kv_low, kv_high), (w_low, w_high) = _bounds(cfg)
        assert kv_low <= Deployment(spec, get_gpu("h200"), 1).kv_bytes_per_token() <= kv_high, name
        assert w_low <= spec.weight_bytes <= w_high, name
