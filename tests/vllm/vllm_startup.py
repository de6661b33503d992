"""vLLM 0.33's own engine start-up for the hybrid oracle drivers (run with the oracle venv's python; never
imported by kvsim or by pytest's process): a real `VllmConfig` for a tiny Llama-shaped model with one
layer per KV cache group of the case, then the KV cache config exactly as `EngineCore._initialize_kv_caches`
builds it (`register_all_kvcache_specs`, `resolve_kv_cache_layout`, `get_global_kv_cache_groups`,
`get_kv_cache_configs`, `generate_scheduler_kv_cache_config`, `update_kv_cache_capacity`,
`resolve_kv_cache_block_sizes`, `resolve_cache_hit_alignment_tokens`), so `CacheConfig`'s
`prefix_cache_retention_interval` (default 0) and `num_gpu_blocks_override` reach the KV cache config the
way they do in `vllm serve`. The pool size is the case's `num_blocks` usable blocks, given to vLLM as
`num_gpu_blocks_override = num_blocks + 1` (vLLM's flag counts its null block).

Case fields read here: "block_size", "num_blocks", "groups" ([{"kind": "full"|"sliding"|"chunked"|"mamba",
"window", "chunk"}]), "max_num_batched_tokens", "max_num_seqs", "max_model_len", "caching",
"retention" (absent: vLLM's default; "none": dense; an int), "async_scheduling" (absent: False),
"mamba_checkpoints" (absent: False; true: Mamba layers that export prefill checkpoints, as Mamba-2's).
"""

import json
import os
import tempfile

from hybrid_oracle_driver import spec_of  # noqa: F401  (sets vLLM's quiet logging first)


def make_config(case: dict):
    """(VllmConfig, {layer name: spec}) of the case, vLLM's CacheConfig defaults unless the case sets one."""
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig

    bs, max_len, mbt = case["block_size"], case["max_model_len"], case["max_num_batched_tokens"]
    mdir = tempfile.mkdtemp(prefix="vllm-hybrid-oracle-")
    with open(os.path.join(mdir, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                   "intermediate_size": 128, "num_attention_heads": 1, "num_key_value_heads": 1,
                   "num_hidden_layers": len(case["groups"]), "vocab_size": 1 << 16,
                   "max_position_embeddings": max_len, "rms_norm_eps": 1e-6, "torch_dtype": "float16",
                   "bos_token_id": 1, "eos_token_id": 2}, f)
    mc = ModelConfig(model=mdir, dtype="float16", seed=0, skip_tokenizer_init=True, max_model_len=max_len)
    sc = SchedulerConfig(max_num_seqs=case["max_num_seqs"], max_num_batched_tokens=mbt, max_model_len=max_len,
                         enable_chunked_prefill=True, is_encoder_decoder=False,
                         async_scheduling=bool(case.get("async_scheduling", False)))
    extra = {}
    if "retention" in case:
        extra["prefix_cache_retention_interval"] = None if case["retention"] == "none" else case["retention"]
    cc = CacheConfig(block_size=bs, enable_prefix_caching=bool(case.get("caching", False)),
                     num_gpu_blocks_override=case["num_blocks"] + 1, **extra)
    vc = VllmConfig(device_config=DeviceConfig(device="cpu"), model_config=mc, scheduler_config=sc, cache_config=cc)
    # vLLM turns its hybrid KV cache manager off where the platform lacks it (`support_hybrid_kv_cache`:
    # CPU); on CUDA, the platform these cases stand for, it stays on (vllm/config/vllm.py)
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    # a Mamba layer with prefix caching: vLLM's Mamba model configs switch the cache to "align" mode with
    # Mamba blocks of the attention block size (`MambaModelConfig.verify_and_update_config`); the tiny
    # Llama-shaped model here has no such config, so the case does it the same way
    align = bool(case.get("caching")) and any(g["kind"] == "mamba" for g in case["groups"])
    if align:
        vc.cache_config.mamba_cache_mode, vc.cache_config.mamba_block_size = "align", bs
    specs = {f"model.layers.{g}.self_attn.attn": spec_of(group, bs, max_len, pad_mamba=True, align=align,
                                                         checkpoints=bool(case.get("mamba_checkpoints")))
             for g, group in enumerate(case["groups"])}
    return vc, specs


def startup(case: dict):
    """(VllmConfig, scheduler KVCacheConfig, scheduler block size, hash block size) as the engine core
    makes them for this case (`EngineCore._initialize_kv_caches`, then `EngineCore.__init__`)."""
    from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
    from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
    from vllm.v1.core.kv_cache_utils import (generate_scheduler_kv_cache_config, resolve_cache_hit_alignment_tokens,
                                             resolve_kv_cache_block_sizes, update_kv_cache_capacity)
    from vllm.v1.core.single_type_kv_cache_manager import register_all_kvcache_specs

    vc, specs = make_config(case)
    register_all_kvcache_specs(vc)
    resolve_kv_cache_layout(vc, [["LBNHC"]], list(specs.values()))
    groups = get_global_kv_cache_groups(vc, [specs])
    # the memory is ample: the pool is set by num_gpu_blocks_override (vLLM's `may_override_num_blocks`)
    configs = get_kv_cache_configs(vc, [specs], [1 << 40], groups)
    kvc = generate_scheduler_kv_cache_config(configs)
    vc.cache_config.num_gpu_blocks = kvc.num_blocks
    vc.cache_config.block_size = min(g.kv_cache_spec.block_size for g in kvc.kv_cache_groups
                                     if g.kv_cache_spec.prefix_cacheable)
    update_kv_cache_capacity(vc, kvc)
    sched_bs, hash_bs = resolve_kv_cache_block_sizes(kvc, vc)
    align = resolve_cache_hit_alignment_tokens(kvc, vc, sched_bs, hash_bs)
    kvc.hash_block_size, kvc.cache_hit_alignment_tokens = hash_bs, align
    return vc, kvc, sched_bs, hash_bs


def group_order(kvc, case: dict) -> list[int]:
    """The case's group index of each of vLLM's KV cache groups, in vLLM's order (one layer each)."""
    assert all(len(g.layer_names) == 1 for g in kvc.kv_cache_groups), "one layer per group expected"
    return [int(g.layer_names[0].split(".")[2]) for g in kvc.kv_cache_groups]
