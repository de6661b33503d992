"""Spec validation names the field, and the presets' shapes are the config.json values."""

import dataclasses

import pytest

from kvsim.specs import GpuSpec, ModelSpec, get_gpu, get_model

BASE = ModelSpec("toy", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                 dtype_bytes=2, max_seq_len=128, num_params=1e6)
GPU = GpuSpec("toy", memory_bytes=10**9, hbm_bytes_per_s=1e9, bf16_flops=1e12, pcie_bytes_per_s=1e8)


@pytest.mark.parametrize("field", ["num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                                   "dtype_bytes", "max_seq_len"])
@pytest.mark.parametrize("value", [0, -1])
def test_model_shape_fields_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"^ModelSpec 'toy': {field} must be positive, got {value}$"):
        dataclasses.replace(BASE, **{field: value})


def test_model_heads_and_params():
    assert dataclasses.replace(BASE, num_layers=1, max_seq_len=1, head_dim=1, dtype_bytes=1).num_layers == 1
    with pytest.raises(ValueError, match=r"num_heads \(6\) must be a multiple of num_kv_heads \(4\)"):
        dataclasses.replace(BASE, num_heads=6, num_kv_heads=4)
    for params in (0.0, -1.0):
        with pytest.raises(ValueError, match="^ModelSpec 'toy': num_params must be positive$"):
            dataclasses.replace(BASE, num_params=params)


@pytest.mark.parametrize("field", ["memory_bytes", "hbm_bytes_per_s", "bf16_flops", "pcie_bytes_per_s"])
@pytest.mark.parametrize("value", [0, -5])
def test_gpu_fields_must_be_positive(field, value):
    with pytest.raises(ValueError, match=f"^GpuSpec 'toy': {field} must be positive$"):
        dataclasses.replace(GPU, **{field: value})
    assert dataclasses.replace(GPU, **{field: 1}).name == "toy"


@pytest.mark.parametrize("name, shape", [
    # (layers, hidden, heads, kv heads, head dim, dtype bytes, max len, params): Hugging Face config.json
    ("opt-13b", (40, 5120, 40, 40, 128, 2, 2048, 12.85e9)),
    ("llama-2-70b", (80, 8192, 64, 8, 128, 2, 4096, 69.0e9)),
    ("llama-3-8b", (32, 4096, 32, 8, 128, 2, 8192, 8.03e9)),
    ("qwen2.5-7b", (28, 3584, 28, 4, 128, 2, 32768, 7.62e9)),
])
def test_preset_shapes(name, shape):
    m = get_model(name)
    assert (m.num_layers, m.hidden_size, m.num_heads, m.num_kv_heads, m.head_dim, m.dtype_bytes,
            m.max_seq_len, m.num_params) == shape


def test_gpu_presets():
    g = get_gpu("h100-80gb")
    assert (g.hbm_bytes_per_s, g.bf16_flops, g.pcie_bytes_per_s) == (3.35e12, 989e12, 50e9)
