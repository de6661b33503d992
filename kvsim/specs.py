"""Model and GPU specifications, named presets, and the KV capacity of a deployment.

Units: bytes, tokens (KV slots), FLOP/s and bytes/s. `--kv-gib` and `--num-blocks` describe the whole
deployment (all tensor-parallel GPUs together), as the vLLM paper's Table 1 does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

GIB = 1024**3

#: Per-GPU memory outside PyTorch's allocator (CUDA context, cuBLAS workspaces, NCCL buffers), kept back
#: when the KV size is derived from `--gpu-mem-util`. vLLM's memory profiler logs 0.16-0.20 GiB
#: (vllm-project/vllm#12126, #14447) up to 1.79 GiB (#10511, Llama-3-8B on an H100) for it.
NON_TORCH_RESERVE_BYTES = GIB // 2
#: Peak activation memory of the profiling forward pass, in units of hidden_size x dtype bytes per
#: batched token: vLLM runs one pass of `--max-num-batched-tokens` tokens and keeps its peak back.
#: vllm-project/vllm#10511 logs 1.26 GiB for Llama-3-8B (hidden 4096, bf16) at 8192 tokens:
#: 1.26 GiB / (8192 x 4096 x 2 B) = 20.2.
ACTIVATION_HIDDENS_PER_BATCHED_TOKEN = 20

#: vLLM's `--kv-cache-dtype` choices and their bytes per element (`auto`: the model's dtype).
KV_CACHE_DTYPES = {"auto": None, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}

#: The most KV token slots a run may have (about 1.1e15): counts stay exact in float64 time averages,
#: and no real deployment comes near (OPT-13B would need 800 PiB of KV memory).
MAX_CAPACITY_TOKENS = 2**50


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape, as far as the KV cache and the cost model need it.

    `num_params` counts every weight (all experts of a MoE model); `active_params` the weights one
    token runs through (None: all of them). `dtype_bytes` is the activation/compute dtype;
    `weight_bytes_per_param` that of quantized weights (None: dtype_bytes), applied to all but
    `unquantized_params` (embeddings and LM head, which quantized checkpoints keep in dtype_bytes);
    `kv_dtype_bytes` that of the KV cache (None: dtype_bytes). `num_experts`/`experts_per_token`: routed
    experts per MoE layer and those each token uses (0 for a dense model)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype_bytes: int
    max_seq_len: int
    num_params: float
    active_params: float | None = None
    num_experts: int = 0
    experts_per_token: int = 0
    weight_bytes_per_param: float | None = None
    unquantized_params: float = 0.0
    kv_dtype_bytes: int | None = None

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
        if self.active_params is not None and not 0 < self.active_params <= self.num_params:
            raise ValueError(f"ModelSpec {self.name!r}: active_params must be in (0, num_params]")
        if not 0 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"ModelSpec {self.name!r}: experts_per_token ({self.experts_per_token}) must "
                             f"be in [0, num_experts = {self.num_experts}]")
        if self.weight_bytes_per_param is not None and self.weight_bytes_per_param <= 0:
            raise ValueError(f"ModelSpec {self.name!r}: weight_bytes_per_param must be positive")
        if not 0 <= self.unquantized_params <= self.num_params:
            raise ValueError(f"ModelSpec {self.name!r}: unquantized_params must be in [0, num_params]")
        if self.kv_dtype_bytes is not None and self.kv_dtype_bytes <= 0:
            raise ValueError(f"ModelSpec {self.name!r}: kv_dtype_bytes must be positive")

    @property
    def kv_bytes(self) -> int:
        """Bytes per KV-cache element."""
        return self.kv_dtype_bytes or self.dtype_bytes

    @property
    def compute_params(self) -> float:
        """Parameters one token computes with (the active experts only, for MoE)."""
        return self.num_params if self.active_params is None else self.active_params

    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """Bytes of K and V for one token on one of `tp` GPUs: 2 x layers x KV heads per GPU x head_dim x
        KV bytes, where each GPU holds max(1, kv_heads / tp) whole heads (replicated when tp > kv_heads,
        as vLLM does)."""
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * self.kv_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights, whole model: quantized parameters x weight_bytes_per_param plus the
        unquantized ones x dtype_bytes (every expert of a MoE model counts)."""
        if self.weight_bytes_per_param is None:
            return self.num_params * self.dtype_bytes
        quantized = self.num_params - self.unquantized_params
        return quantized * self.weight_bytes_per_param + self.unquantized_params * self.dtype_bytes

    def with_kv_cache_dtype(self, kv_cache_dtype: str) -> "ModelSpec":
        """This model with vLLM's `--kv-cache-dtype` (auto|fp16|bf16|fp8) applied."""
        key = kv_cache_dtype.lower()
        if key not in KV_CACHE_DTYPES:
            raise ValueError(f"--kv-cache-dtype: unknown {kv_cache_dtype!r}; known: {', '.join(KV_CACHE_DTYPES)}")
        return replace(self, kv_dtype_bytes=KV_CACHE_DTYPES[key] or self.kv_dtype_bytes)

    def with_max_model_len(self, max_model_len: int | None) -> "ModelSpec":
        """This model served with vLLM's `--max-model-len` (None: the model's own maximum). Longer than
        the model's maximum is refused, as vLLM does."""
        if max_model_len is None:
            return self
        if not 0 < max_model_len <= self.max_seq_len:
            raise ValueError(f"--max-model-len must be in [1, {self.max_seq_len}] for {self.name} (its "
                             f"maximum context), got {max_model_len}")
        return replace(self, max_seq_len=max_model_len)


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
)}

#: Hugging Face ids accepted for the presets (compared case-insensitively), base and chat/instruct
#: variants: the KV and weight figures are the same.
HF_IDS: dict[str, str] = {hf.lower(): name for name, ids in {
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
}.items() for hf in ids}

#: GPU memory is what the device reports to CUDA (`torch.cuda.mem_get_info()`'s total, the
#: `total_gpu_memory` of vLLM's memory profiler), not the marketing figure: a little under the
#: nominal GB taken as GiB. Sources: a100-40gb 39.50 GiB and a100-80gb 79.25 GiB from PyTorch
#: out-of-memory messages ("GPU 0 has a total capacity of ..."); h100-80gb 79.22 GiB from vLLM's
#: profiler log (vllm-project/vllm#10511); h200, l4 and a10g: nvidia-smi's total (143771, 23034 and
#: 23028 MiB) less 0.6 GiB, the gap between nvidia-smi and CUDA on the A100s and the H100.
#: Bandwidths: SXM HBM, dense (non-sparse) bf16 tensor FLOP/s, and a practical host-device PCIe rate
#: (about 80 % of the link's peak).
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100-40gb", int(39.50 * GIB), 1.555e12, 312e12, 25e9),
    GpuSpec("a100-80gb", int(79.25 * GIB), 2.039e12, 312e12, 25e9),
    GpuSpec("h100-80gb", int(79.22 * GIB), 3.35e12, 989e12, 50e9),
    GpuSpec("h200", int(139.80 * GIB), 4.8e12, 989e12, 50e9),
    GpuSpec("l4", int(21.89 * GIB), 300e9, 121e12, 25e9),
    GpuSpec("a10g", int(21.89 * GIB), 600e9, 70e12, 25e9),
)}


def _lookup(table: dict, name: str, what: str):
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[key]


def get_model(name: str) -> ModelSpec:
    """The preset named `name` or its Hugging Face id (case-insensitive); ValueError listing the known
    names otherwise."""
    return _lookup(MODELS, HF_IDS.get(name.lower(), name), "model")


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset named `name` (case-insensitive); ValueError listing the known names otherwise."""
    return _lookup(GPUS, name, "GPU")


def load_hf_config(path: str | Path) -> ModelSpec:
    """A ModelSpec from a Hugging Face `config.json` or a folder holding one (see kvsim/hf_config.py)."""
    from kvsim.hf_config import load_hf_config as load
    return load(path)


def activation_reserve_bytes(model: ModelSpec, max_batched_tokens: int) -> float:
    """Per-GPU memory kept back besides weights and KV: NON_TORCH_RESERVE_BYTES plus the peak of a
    forward pass over `max_batched_tokens` tokens (ACTIVATION_HIDDENS_PER_BATCHED_TOKEN hiddens each)."""
    return (NON_TORCH_RESERVE_BYTES
            + max_batched_tokens * ACTIVATION_HIDDENS_PER_BATCHED_TOKEN * model.hidden_size * model.dtype_bytes)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on `tp` GPUs of one kind with tensor parallelism: weights and attention heads split evenly
    (tp must divide the attention heads); KV heads split, or replicated when tp exceeds them so that each
    GPU holds one whole KV head (tp must then be a multiple of the KV heads), as vLLM does."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {self.tp}")
        m = self.model
        if m.num_heads % self.tp:
            raise ValueError(f"--tp {self.tp}: {m.name}'s {m.num_heads} attention heads cannot be split "
                             f"evenly over {self.tp} GPUs (tp must divide {m.num_heads})")
        if m.num_kv_heads % self.tp and self.tp % m.num_kv_heads:
            raise ValueError(f"--tp {self.tp}: {m.name}'s {m.num_kv_heads} KV heads can be neither split "
                             f"evenly nor replicated evenly over {self.tp} GPUs (tp must divide "
                             f"{m.num_kv_heads} or be a multiple of it)")

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token on all `tp` GPUs together (replicated KV heads count on each)."""
        return self.tp * self.model.kv_bytes_per_token(self.tp)

    def kv_capacity_tokens(self, kv_gib: float | None = None, num_blocks: int | None = None,
                           block_size: int = 16, gpu_mem_util: float = 0.9,
                           max_batched_tokens: int = 8192) -> int:
        """KV slots (tokens) of the whole deployment.

        Exactly one source decides: `kv_gib` (GiB of KV, all GPUs together), `num_blocks` (blocks of
        `block_size` tokens), or else each GPU's memory (as the device reports it) x `gpu_mem_util`
        minus its share of the weights and `activation_reserve_bytes(model, max_batched_tokens)`.
        """
        if kv_gib is not None and num_blocks is not None:
            raise ValueError("give --kv-gib or --num-blocks, not both")
        per_token = self.kv_bytes_per_token()  # whole deployment
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
                   - activation_reserve_bytes(self.model, max_batched_tokens))
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
