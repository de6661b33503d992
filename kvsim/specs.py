"""Model and GPU specifications, named presets, and the KV capacity of a deployment.

Units: bytes, tokens (KV slots), FLOP/s and bytes/s. `--kv-gib` and `--num-blocks` describe the whole
deployment (all tensor-parallel GPUs together), as the vLLM paper's Table 1 does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

GIB = 1024**3

#: Per-GPU memory kept back for activations and the CUDA context when the KV size is derived from
#: `--gpu-mem-util` (vLLM measures this with a profiling forward pass; 1 GiB is its order of magnitude
#: for a 13B model at 8K batched tokens).
ACTIVATION_RESERVE_BYTES = 1 * GIB

#: The most KV token slots a run may have (about 1.1e15): counts stay exact in float64 time averages,
#: and no real deployment comes near (OPT-13B would need 800 PiB of KV memory).
MAX_CAPACITY_TOKENS = 2**50


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape, as far as the KV cache and the cost model need it."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_seq_len: int
    num_params: float

    def __post_init__(self) -> None:
        for field in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "dtype_bytes", "max_seq_len"):
            if getattr(self, field) <= 0:
                raise ValueError(f"ModelSpec {self.name!r}: {field} must be positive, got {getattr(self, field)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"ModelSpec {self.name!r}: num_heads ({self.num_heads}) must be a multiple "
                             f"of num_kv_heads ({self.num_kv_heads})")
        if self.num_params <= 0:
            raise ValueError(f"ModelSpec {self.name!r}: num_params must be positive")

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of K and V for one token on one GPU: 2 x layers x kv_heads x head_dim x dtype / tp."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes // tp

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (parameters x dtype bytes), whole model."""
        return self.num_params * self.dtype_bytes


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: memory in bytes, HBM bandwidth and PCIe bandwidth in bytes/s, dense bf16 FLOP/s."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    pcie_bytes_per_s: float

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "hbm_bytes_per_s", "bf16_flops", "pcie_bytes_per_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"GpuSpec {self.name!r}: {field} must be positive")


def _m(name, layers, hidden, heads, kv_heads, max_len, params, head_dim=128, dtype_bytes=2) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, head_dim, dtype_bytes, max_len, params)


#: Shapes from each model's Hugging Face config.json; parameter counts from the model cards.
MODELS: dict[str, ModelSpec] = {m.name: m for m in (
    _m("opt-13b", 40, 5120, 40, 40, 2048, 12.85e9),
    _m("opt-66b", 64, 9216, 72, 72, 2048, 65.7e9),
    _m("opt-175b", 96, 12288, 96, 96, 2048, 175e9),
    _m("llama-13b", 40, 5120, 40, 40, 2048, 13.0e9),
    _m("llama-2-7b", 32, 4096, 32, 32, 4096, 6.74e9),
    _m("llama-2-13b", 40, 5120, 40, 40, 4096, 13.0e9),
    _m("llama-2-70b", 80, 8192, 64, 8, 4096, 69.0e9),
    _m("llama-3-8b", 32, 4096, 32, 8, 8192, 8.03e9),
    _m("llama-3-70b", 80, 8192, 64, 8, 8192, 70.6e9),
    _m("mistral-7b", 32, 4096, 32, 8, 32768, 7.24e9),
    _m("qwen2.5-7b", 28, 3584, 28, 4, 32768, 7.62e9),
)}

#: Datasheet figures: memory as the driver reports it, SXM HBM bandwidth, dense (non-sparse) bf16
#: tensor FLOP/s, and a practical host-device PCIe rate (about 80 % of the link's peak).
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100-40gb", 40 * GIB, 1.555e12, 312e12, 25e9),
    GpuSpec("a100-80gb", 80 * GIB, 2.039e12, 312e12, 25e9),
    GpuSpec("h100-80gb", 80 * GIB, 3.35e12, 989e12, 50e9),
    GpuSpec("h200", 140 * GIB, 4.8e12, 989e12, 50e9),
    GpuSpec("l4", 24 * GIB, 300e9, 121e12, 25e9),
    GpuSpec("a10g", 24 * GIB, 600e9, 70e12, 25e9),
)}


def _lookup(table: dict, name: str, what: str):
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[key]


def get_model(name: str) -> ModelSpec:
    """The preset named `name` (case-insensitive); ValueError listing the known names otherwise."""
    return _lookup(MODELS, name, "model")


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset named `name` (case-insensitive); ValueError listing the known names otherwise."""
    return _lookup(GPUS, name, "GPU")


_DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float8_e4m3fn": 1, "fp8": 1}


def load_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` (LLaMA/Mistral/Qwen and OPT key names)."""
    path = Path(path)
    try:
        cfg = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: cannot read model config: {exc}") from None

    def need(*keys):
        for key in keys:
            if key in cfg:
                return cfg[key]
        raise ValueError(f"{path}: field {keys[0]!r} missing from model config")

    layers = need("num_hidden_layers", "n_layer", "num_layers")
    hidden = need("hidden_size", "n_embd", "d_model")
    heads = need("num_attention_heads", "n_head")
    kv_heads = cfg.get("num_key_value_heads") or heads
    head_dim = cfg.get("head_dim") or hidden // heads
    max_len = need("max_position_embeddings", "n_positions", "max_seq_len")
    dtype_bytes = _DTYPE_BYTES.get(str(cfg.get("torch_dtype", "float16")).replace("torch.", ""), 2)
    ffn = cfg.get("intermediate_size") or cfg.get("ffn_dim") or 4 * hidden
    vocab = cfg.get("vocab_size", 32000)
    gated = "intermediate_size" in cfg  # LLaMA-style gated MLP has three projections
    per_layer = 2 * hidden * hidden + 2 * hidden * kv_heads * head_dim + (3 if gated else 2) * hidden * ffn
    params = layers * per_layer + 2 * vocab * hidden
    name = cfg.get("_name_or_path") or path.parent.name or path.stem
    return ModelSpec(str(name), int(layers), int(hidden), int(heads), int(kv_heads), int(head_dim),
                     dtype_bytes, int(max_len), float(params))


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on `tp` GPUs of one kind with tensor parallelism (weights and KV split evenly)."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {self.tp}")
        if self.model.num_kv_heads % self.tp and self.tp % self.model.num_kv_heads:
            raise ValueError(f"{self.model.name}: {self.model.num_kv_heads} KV heads cannot be split "
                             f"over tp={self.tp} GPUs")

    def kv_capacity_tokens(self, kv_gib: float | None = None, num_blocks: int | None = None,
                           block_size: int = 16, gpu_mem_util: float = 0.9) -> int:
        """KV slots (tokens) of the whole deployment.

        Exactly one source decides: `kv_gib` (GiB of KV, all GPUs together), `num_blocks` (blocks of
        `block_size` tokens), or else each GPU's memory x `gpu_mem_util` minus its share of the weights
        and ACTIVATION_RESERVE_BYTES.
        """
        if kv_gib is not None and num_blocks is not None:
            raise ValueError("give --kv-gib or --num-blocks, not both")
        per_token = self.model.kv_bytes_per_token()  # whole deployment
        if num_blocks is not None:
            if num_blocks <= 0:
                raise ValueError(f"--num-blocks must be positive, got {num_blocks}")
            return _bounded(num_blocks * block_size, f"--num-blocks {num_blocks} x --block-size {block_size}")
        if kv_gib is not None:
            if not math.isfinite(kv_gib) or kv_gib <= 0:
                raise ValueError(f"--kv-gib must be positive and finite, got {kv_gib}")
            return _bounded(int(math.floor(kv_gib * GIB / per_token)), f"--kv-gib {kv_gib:g}")
        if not 0 < gpu_mem_util <= 1:
            raise ValueError(f"--gpu-mem-util must be in (0, 1], got {gpu_mem_util}")
        per_gpu = (self.gpu.memory_bytes * gpu_mem_util - self.model.weight_bytes / self.tp
                   - ACTIVATION_RESERVE_BYTES)
        if per_gpu <= 0:
            raise ValueError(f"{self.model.name} on {self.tp} x {self.gpu.name} at gpu-mem-util "
                             f"{gpu_mem_util}: weights leave no memory for the KV cache")
        return _bounded(int(math.floor(per_gpu * self.tp / per_token)), f"--tp {self.tp}")


def _bounded(capacity_tokens: int, source: str) -> int:
    """`capacity_tokens`, or a ValueError naming the flag (`source`) when it passes MAX_CAPACITY_TOKENS."""
    if capacity_tokens > MAX_CAPACITY_TOKENS:
        raise ValueError(f"{source}: {capacity_tokens:.3g} KV token slots is more than kvsim models "
                         f"(at most 2^50 = {MAX_CAPACITY_TOKENS:.3g})")
    return capacity_tokens
