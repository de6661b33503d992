"""vLLM 0.33's own start-up KV cache figures for a list of cases (run with the oracle venv's python).

stdin: JSON list of cases, each {"layers": [{"kind", "count", "num_kv_heads", "head_dim", "window",
"chunk", "latent_dim"}], "hf_config": the config.json fields (its text config), "architecture",
"mamba_ssm_cache_dtype" (or null), "tp", "block_size", "max_model_len", "max_num_batched_tokens",
"kv_bytes_per_gpu", "hybrid", "prefix_caching", "layout" (a KVCacheLayout name, default LBNHC:
these presets' figures are the same under every layout)}. stdout: JSON list of {"block_size", "num_blocks", "num_groups",
"max_concurrency", "capacity_tokens"} or {"error"}.

vLLM builds everything that decides the figures: the Mamba state shapes and dtypes (the model class's
get_mamba_state_shape_from_config / get_mamba_state_dtype_from_config on the HF config), the block size
(Platform._align_hybrid_block_size with the Triton attention backend's kernel blocks), the layer specs
(FullAttentionSpec, SlidingWindowSpec, ChunkedLocalAttentionSpec, MLAAttentionSpec, MambaSpec), the
groups (get_kv_cache_groups), the pool and vLLM's check that one max-length request fits
(get_kv_cache_configs) and the figures
(get_kv_cache_capacity). Only the VllmConfig is a stand-in holding the fields these functions read.
"""
import json
import logging
import os
import sys
import warnings
from dataclasses import replace
from types import SimpleNamespace

warnings.filterwarnings("ignore")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
logging.disable(logging.WARNING)

import torch  # noqa: E402
from vllm.model_executor.layers.mamba import abstract  # noqa: E402
from vllm.platforms.interface import Platform  # noqa: E402
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend  # noqa: E402
from vllm.v1.core import kv_cache_planning as planning  # noqa: E402
from vllm.v1.core.kv_cache_utils import generate_scheduler_kv_cache_config, get_kv_cache_capacity  # noqa: E402
from vllm.v1.kv_cache_interface import (ChunkedLocalAttentionSpec, FullAttentionSpec,  # noqa: E402
                                        MambaSpec, MLAAttentionSpec, SlidingWindowSpec)
from vllm.v1.kv_cache_layout import KVCacheLayout  # noqa: E402

Platform._find_non_ssm_backends = classmethod(lambda cls, config: [TritonAttentionBackend])
# No layer of these models declares a prefill checkpoint alignment on this backend (Mamba-2 layers never
# do; the gated delta net only with FlashInfer's kernels): the lookup needs live layers, so it is fixed here.
abstract.get_mamba_prefill_checkpoint_alignment = lambda config: None


def vllm_config(case):
    hf = SimpleNamespace(**case["hf_config"])
    if case.get("mamba_ssm_cache_dtype"):
        hf.mamba_ssm_cache_dtype = case["mamba_ssm_cache_dtype"]
    attn = [g for g in case["layers"] if g["kind"] != "mamba"]
    use_mla = any(g["kind"] == "mla" for g in attn)
    heads = attn[0].get("num_kv_heads") or 1
    tp = case["tp"]
    model = SimpleNamespace(
        dtype=torch.bfloat16, use_mla=use_mla, architecture=case["architecture"],
        architectures=[case["architecture"]], hf_config=hf, hf_text_config=hf, model_impl="auto",
        convert_type="none", max_model_len=case["max_model_len"], supports_kv_cache_grouping=False,
        is_hybrid=any(g["kind"] == "mamba" for g in case["layers"]) and bool(attn),
        original_max_model_len=case["max_model_len"],
        get_num_kv_heads=lambda pc: 1 if use_mla else max(1, heads // tp),
        get_head_size=lambda: attn[0]["latent_dim"] if use_mla else attn[0]["head_dim"])
    cache = SimpleNamespace(
        block_size=case["block_size"], cache_dtype="auto", mamba_cache_dtype="auto",
        mamba_ssm_cache_dtype=case.get("mamba_ssm_cache_dtype") or "auto",
        # MambaModelConfig.verify_and_update_config: "align" with prefix caching, else "none" and
        # Mamba blocks of max_model_len tokens
        mamba_cache_mode="align" if case.get("prefix_caching") else "none",
        enable_prefix_caching=bool(case.get("prefix_caching")),
        mamba_block_size=case["block_size"] if case.get("prefix_caching") else case["max_model_len"], mamba_page_size_padded=None, kv_cache_dtype_skip_layers=None,
        user_specified_block_size=True, num_gpu_blocks_override=None, prefix_cache_retention_interval=0,  # (vLLM's default)
        skip_page_size_padded=None, use_replayssm=False, get_resolved_kv_cache_layout=lambda: KVCacheLayout[case.get("layout", "LBNHC")])
    return SimpleNamespace(
        model_config=model, cache_config=cache,
        parallel_config=SimpleNamespace(tensor_parallel_size=tp, decode_context_parallel_size=1,
                                        pipeline_parallel_size=1),
        scheduler_config=SimpleNamespace(disable_hybrid_kv_cache_manager=not case["hybrid"],
                                         max_num_batched_tokens=case["max_num_batched_tokens"],
                                         async_scheduling=True),
        attention_config=SimpleNamespace(hisparse_config=None), speculative_config=None,
        max_in_flight_tokens=2 * case["max_num_batched_tokens"], num_speculative_tokens=0)


class GatedDeltaNetStates:
    """qwen3_next.py's two classmethods, word for word in what they call, for when the model module
    cannot be imported on this CPU venv (it needs compressed_tensors): vLLM's own calculators."""

    @classmethod
    def get_mamba_state_shape_from_config(cls, config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
        hf = config.model_config.hf_text_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            config.parallel_config.tensor_parallel_size, hf.linear_num_key_heads, hf.linear_num_value_heads,
            hf.linear_key_head_dim, hf.linear_value_head_dim, hf.linear_conv_kernel_dim, 0)

    @classmethod
    def get_mamba_state_dtype_from_config(cls, config):
        from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator
        return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
            config.model_config.dtype, config.cache_config.mamba_cache_dtype,
            config.cache_config.mamba_ssm_cache_dtype)


def _resolve_with_fallback(resolve):
    def resolve_model_cls(architectures, model_config):
        try:
            return resolve(architectures, model_config)
        except Exception:
            arch = architectures if isinstance(architectures, str) else architectures[0]
            if arch == "Qwen3NextForCausalLM":
                return GatedDeltaNetStates, arch
            raise
    return resolve_model_cls


from vllm.model_executor.models import ModelRegistry  # noqa: E402

ModelRegistry.resolve_model_cls = _resolve_with_fallback(ModelRegistry.resolve_model_cls)


def _uses_mamba_mixer2(model_cls) -> bool:
    """Whether vLLM's model module builds its Mamba layers as MambaMixer2 (Nemotron-H, Granite 4 hybrid,
    Falcon-H1, Zamba2, Mamba-2), whose `get_kv_cache_spec` adds one prefill checkpoint block."""
    import inspect
    module = sys.modules[model_cls.__module__]
    return module.__name__.startswith("vllm.model_executor.models") and "MambaMixer2(" in inspect.getsource(module)


def mamba_model_class(case, config):
    """The vLLM model class whose state-shape classmethods size the Mamba layers."""
    return ModelRegistry.resolve_model_cls(case["architecture"], config.model_config)[0]


def layer_specs(case, config):
    cache, bs = config.cache_config, config.cache_config.block_size
    specs = {}
    model_cls = None
    for g in case["layers"]:
        for i in range(g["count"]):
            name = f"{g['kind']}.{g.get('window') or g.get('chunk') or ''}.{i}"
            common = dict(block_size=bs, dtype=torch.bfloat16)
            if g["kind"] == "full":
                spec = FullAttentionSpec(num_kv_heads=max(1, g["num_kv_heads"] // case["tp"]),
                                         head_size=g["head_dim"], **common)
            elif g["kind"] == "sliding":
                spec = SlidingWindowSpec(num_kv_heads=max(1, g["num_kv_heads"] // case["tp"]),
                                         head_size=g["head_dim"], sliding_window=g["window"], **common)
            elif g["kind"] == "chunked":
                spec = ChunkedLocalAttentionSpec(num_kv_heads=max(1, g["num_kv_heads"] // case["tp"]),
                                                 head_size=g["head_dim"], attention_chunk_size=g["chunk"],
                                                 **common)
            elif g["kind"] == "mla":
                spec = MLAAttentionSpec(num_kv_heads=1, max_tp_shards=1, head_size=g["latent_dim"],
                                        cache_dtype_str="auto", **common)
            else:
                model_cls = model_cls or mamba_model_class(case, config)
                spec = MambaSpec(shapes=tuple(model_cls.get_mamba_state_shape_from_config(config)),
                                 dtypes=tuple(model_cls.get_mamba_state_dtype_from_config(config)),
                                 block_size=cache.mamba_block_size, page_size_padded=cache.mamba_page_size_padded)
                if _uses_mamba_mixer2(model_cls):    # MambaMixer2.get_kv_cache_spec, word for word
                    spec = replace(spec, num_prefill_checkpoint_blocks=1, prefill_checkpoint_alignment=1)
            specs[name] = spec
    return specs


def run(case):
    config = vllm_config(case)
    if config.model_config.is_hybrid:
        Platform._align_hybrid_block_size(config, TritonAttentionBackend)
    specs = layer_specs(case, config)
    groups = planning.get_kv_cache_groups(config, dict(specs))
    # the scheduler's view, as EngineCore._initialize_kv_caches hands it on
    kv_config = generate_scheduler_kv_cache_config(
        planning.get_kv_cache_configs(config, [specs], [case["kv_bytes_per_gpu"]], groups))
    tokens, concurrency = get_kv_cache_capacity(config, kv_config)
    return {"block_size": config.cache_config.block_size, "num_blocks": kv_config.num_blocks,
            "num_groups": len(groups), "max_concurrency": concurrency, "capacity_tokens": tokens}


if __name__ == "__main__":
    out = []
    for case in json.load(sys.stdin):
        try:
            out.append(run(case))
        except Exception as exc:  # vLLM refusing a configuration is a result too
            out.append({"error": f"{type(exc).__name__}: {exc}"})
    json.dump(out, sys.stdout)
