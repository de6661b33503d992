"""The edges of every spec check: the last accepted value, the first refused one, and the exact message."""

import dataclasses
import re

import pytest

from kvsim.specs import GIB, Deployment, GpuSpec, ModelSpec, get_gpu, get_model
from kvsim.specs.presets import _m as preset_entry

# 2 layers x 2 KV heads x 16 dims x 2 bytes x K and V = 256 bytes of KV per token; 1e6 params = 2e6 B.
TOY = ModelSpec("toy", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                dtype_bytes=2, max_seq_len=128, num_params=1e6)


def toy(**changes) -> ModelSpec:
    return dataclasses.replace(TOY, **changes)


def refused(message: str):
    return pytest.raises(ValueError, match="^" + re.escape(message) + "$")


def test_parameter_counts_at_their_edges():
    assert toy(num_params=1.0).num_params == 1.0                   # any positive count
    assert toy(active_params=1.0).compute_params == 1.0            # the smallest active count
    assert toy(active_params=1e6).compute_params == 1e6            # all of them active
    for active in (0.0, 1e6 + 1):
        with refused("ModelSpec 'toy': active_params must be in (0, num_params]"):
            toy(active_params=active)
    assert toy(unquantized_params=1e6, weight_bytes_per_param=0.5).weight_bytes == 2e6   # none quantized
    for unquantized in (-1.0, 1e6 + 1):
        with refused("ModelSpec 'toy': unquantized_params must be in [0, num_params]"):
            toy(unquantized_params=unquantized)


def test_experts_and_byte_widths_at_their_edges():
    assert toy(num_experts=8, experts_per_token=8).experts_per_token == 8
    with refused("ModelSpec 'toy': experts_per_token (3) must be in [0, num_experts = 2]"):
        toy(num_experts=2, experts_per_token=3)
    with refused("ModelSpec 'toy': weight_bytes_per_param must be positive"):
        toy(weight_bytes_per_param=0.0)
    with refused("ModelSpec 'toy': kv_dtype_bytes must be positive"):
        toy(kv_dtype_bytes=0)
    with refused("ModelSpec 'toy': kv_dtype_bytes must be positive"):
        toy(kv_dtype_bytes=-1)
    assert toy(kv_dtype_bytes=1).kv_bytes_per_token() == 128


def test_kv_bytes_per_token_is_a_whole_byte_count():
    # 2 KV heads on 4 GPUs: each keeps one whole head, 2 x 2 x 1 x 16 x 2 = 128 bytes, an int
    per_gpu = TOY.kv_bytes_per_token(4)
    assert per_gpu == 128 and type(per_gpu) is int
    assert type(TOY.kv_bytes_per_token()) is int and TOY.kv_bytes_per_token() == 256
    assert type(Deployment(TOY, get_gpu("l4"), 2).kv_bytes_per_token()) is int


def test_max_model_len_edges_and_kv_cache_dtype_message():
    assert TOY.with_max_model_len(1).max_seq_len == 1
    assert TOY.with_max_model_len(128).max_seq_len == 128
    with refused("--max-model-len must be in [1, 128] for toy (its maximum context), got 0"):
        TOY.with_max_model_len(0)
    with refused("--kv-cache-dtype: unknown 'int4'; known: auto, fp16, bf16, fp8, fp8_e4m3, fp8_e5m2"):
        TOY.with_kv_cache_dtype("int4")


def test_unknown_names_list_every_known_one():
    # (issue 37 added b200, mi300x, l40s, rtx-4090 and rtx-pro-6000, and the pointer to --gpu-config)
    with pytest.raises(ValueError, match=re.escape("unknown GPU 'tpu'; known: a100-40gb, a100-80gb, h100-80gb, "
                                                   "h200, b200, mi300x, l40s, l4, a10g, rtx-4090, rtx-pro-6000; "
                                                   "or describe any other GPU with --gpu-config FILE.json")):
        get_gpu("tpu")
    with pytest.raises(ValueError, match=re.escape("unknown model 'gpt-9'; known: opt-13b, opt-66b, ")):
        get_model("gpt-9")


def test_capacity_sources_at_their_edges():
    dep = Deployment(TOY, get_gpu("l4"))
    with refused("tensor-parallel degree must be >= 1, got 0"):
        Deployment(TOY, get_gpu("l4"), 0)
    with refused("give --kv-gib or --num-blocks, not both"):
        dep.kv_capacity_tokens(kv_gib=1, num_blocks=1)
    assert dep.kv_capacity_tokens(num_blocks=1, block_size=16) == 16
    with refused("--num-blocks must be positive, got 0"):
        dep.kv_capacity_tokens(num_blocks=0)
    # half a GiB over 256 B per token: 2^29 / 2^8 = 2^21 slots
    assert dep.kv_capacity_tokens(kv_gib=0.5) == 2**21
    with refused("--kv-gib must be positive and finite, got 0"):
        dep.kv_capacity_tokens(kv_gib=0)


def test_gpu_memory_utilisation_edges():
    """A GPU of exactly the weights (2e6 B) + 0.5 GiB of reserve (no batched tokens) + 1000 tokens of KV
    (256,000 B): at utilisation 1 it holds 1000 slots; one byte of KV less than a token leaves 999."""
    memory = 2_000_000 + GIB // 2 + 256_000
    dep = Deployment(TOY, GpuSpec("exact", memory, 1e12, 1e14, 1e10))
    assert dep.kv_capacity_tokens(gpu_mem_util=1.0, max_batched_tokens=0) == 1000
    short = Deployment(TOY, GpuSpec("exact", memory - 1, 1e12, 1e14, 1e10))
    assert short.kv_capacity_tokens(gpu_mem_util=1.0, max_batched_tokens=0) == 999
    for util in (0.0, 1.5):
        with refused(f"--gpu-mem-util must be in (0, 1], got {util}"):
            dep.kv_capacity_tokens(gpu_mem_util=util)
    # memory that is exactly weights + reserve leaves nothing for the KV cache
    bare = Deployment(TOY, GpuSpec("bare", 2_000_000 + GIB // 2, 1e12, 1e14, 1e10))
    with refused("toy on 1 x bare at gpu-mem-util 1.0: weights leave no memory for the KV cache (per GPU: 0.00 "
                 "GiB of weights + 0.50 GiB of activations and runtime of 0.50 GiB; a larger --tp splits the weights)"):
        bare.kv_capacity_tokens(gpu_mem_util=1.0, max_batched_tokens=0)


def test_memory_derived_capacity_over_the_limit_names_tp():
    # 2^60 B x 0.9 = 1.0376e18 B (weights and reserve are lost in the rounding) / 256 B = 4.05e15 slots
    huge = Deployment(TOY, GpuSpec("huge", 2**60, 1e12, 1e14, 1e10))
    with pytest.raises(ValueError, match=re.escape("--tp 1: 4.05e+15 KV token slots is more than kvsim models")):
        huge.kv_capacity_tokens()


def test_preset_builder_fills_bf16_head_dim_128_and_moe_fields():
    """`_m` builds the MODELS presets: positional shape, head_dim 128 and 2-byte dtype
    unless given, MoE keywords passed through."""
    assert preset_entry("m", 3, 256, 4, 2, 512, 7e6) == ModelSpec(
        "m", num_layers=3, hidden_size=256, num_heads=4, num_kv_heads=2, head_dim=128, dtype_bytes=2,
        max_seq_len=512, num_params=7e6)
    assert preset_entry("e", 3, 256, 4, 2, 512, 7e6, head_dim=64, dtype_bytes=1, active_params=2e6,
                             num_experts=4, experts_per_token=1) == ModelSpec(
        "e", 3, 256, 4, 2, 64, 1, 512, 7e6, active_params=2e6, num_experts=4, experts_per_token=1)
