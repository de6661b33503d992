"""A model on tensor-parallel GPUs (`Deployment`) and the KV capacity it leaves, in token slots.

`--kv-gib` and `--num-blocks` describe the whole deployment (all tensor-parallel GPUs together), as the
vLLM paper's Table 1 does. Bytes and tokens throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvsim.specs.gpu import GpuSpec
from kvsim.specs.model import GIB, ModelSpec

#: Per-GPU memory outside PyTorch's allocator (CUDA context, cuBLAS workspaces, NCCL buffers), kept back
#: when the KV size is derived from `--gpu-mem-util`. vLLM's memory profiler logs 0.16-0.20 GiB
#: (vllm-project/vllm#12126, #14447) up to 1.79 GiB (#10511, Llama-3-8B on an H100) for it.
NON_TORCH_RESERVE_BYTES = GIB // 2
#: Peak activation memory of the profiling forward pass, in units of hidden_size x dtype bytes per
#: batched token: vLLM runs one pass of `--max-num-batched-tokens` tokens and keeps its peak back.
#: vllm-project/vllm#10511 logs 1.26 GiB for Llama-3-8B (hidden 4096, bf16) at 8192 tokens:
#: 1.26 GiB / (8192 x 4096 x 2 B) = 20.2.
ACTIVATION_HIDDENS_PER_BATCHED_TOKEN = 20

#: The most KV token slots a run may have (about 1.1e15): counts stay exact in float64 time averages,
#: and no real deployment comes near (OPT-13B would need 800 PiB of KV memory).
MAX_CAPACITY_TOKENS = 2**50


def activation_reserve_bytes(model: ModelSpec, max_batched_tokens: int) -> float:
    """Per-GPU memory kept back besides weights and KV: NON_TORCH_RESERVE_BYTES plus the peak of a
    forward pass over `max_batched_tokens` tokens (ACTIVATION_HIDDENS_PER_BATCHED_TOKEN hiddens each)."""
    return (NON_TORCH_RESERVE_BYTES
            + max_batched_tokens * ACTIVATION_HIDDENS_PER_BATCHED_TOKEN * model.hidden_size * model.dtype_bytes)


#: kvsim.fleet.config.MAX_UNITS (the one per-unit cap; specs sit below fleet, so the number is repeated
#: here and a test holds the two equal)
MAX_DP = 1024


@dataclass(frozen=True, slots=True)
class MemoryLedger:
    """One GPU's memory as vLLM's start-up profiling splits it (bytes, per GPU): `total` as the device
    reports it, `budget` = total x gpu_memory_utilization, then `weights` (its share of the model),
    `activation_peak` (the profiling forward pass), `non_torch` (CUDA context, NCCL, cuBLAS) and `kv`,
    what is left for the KV cache (budget minus the three; negative when the weights do not fit)."""

    total: float
    gpu_mem_util: float
    weights: float
    activation_peak: float
    non_torch: float

    @property
    def budget(self) -> float:
        return self.total * self.gpu_mem_util

    @property
    def kv(self) -> float:
        return self.budget - self.weights - (self.activation_peak + self.non_torch)   # (as summed before)


@dataclass(frozen=True, slots=True)
class Deployment:
    """A model on `tp` GPUs of one kind with tensor parallelism: weights and attention heads split evenly
    (tp must divide the attention heads); KV heads split, or replicated when tp exceeds them so that each
    GPU holds one whole KV head (tp must then be a multiple of the KV heads), as vLLM does.

    `dp`: vLLM's --data-parallel-size, engines of `tp` GPUs each serving their own requests (a `Deployment`
    describes one of them; `kvsim run` runs `dp` of them behind vLLM's least-loaded balancer). `ep`:
    --enable-expert-parallel, a MoE model's experts spread whole over the tp x dp GPUs instead of
    TP-sharded: each GPU holds the dense weights / tp and the experts / (tp x dp)."""

    model: ModelSpec
    gpu: GpuSpec
    tp: int = 1
    dp: int = 1
    ep: bool = False

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ValueError(f"tensor-parallel degree must be >= 1, got {self.tp}")
        if not 1 <= self.dp <= MAX_DP:
            raise ValueError(f"--data-parallel-size {self.dp}: must be a whole number from 1 to {MAX_DP:,} (the "
                             "cap on replicas and every other per-unit count; each engine is simulated)")
        if self.ep and self.model.num_experts < self.tp * self.dp:
            raise ValueError(f"--enable-expert-parallel: {self.model.name} has {self.model.num_experts} experts, "
                             f"fewer than the {self.tp * self.dp} GPUs (tp x dp) to spread them over")
        m = self.model
        if m.num_heads % self.tp:
            raise ValueError(f"--tp {self.tp}: {m.name}'s {m.num_heads} attention heads cannot be split "
                             f"evenly over {self.tp} GPUs (tp must divide {m.num_heads})")
        if m.num_kv_heads % self.tp and self.tp % m.num_kv_heads:
            raise ValueError(f"--tp {self.tp}: {m.name}'s {m.num_kv_heads} KV heads can be neither split "
                             f"evenly nor replicated evenly over {self.tp} GPUs (tp must divide "
                             f"{m.num_kv_heads} or be a multiple of it)")
        for group in m.layer_groups:
            group.check_tp(self.tp, m.name)

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of all routed experts' weights (0 for a dense model): the parameters beyond the active
        ones, (num_params - active) / (experts - top_k) per expert, times the experts."""
        m = self.model
        if m.num_experts <= m.experts_per_token:
            return 0.0
        per_expert = (m.num_params - m.compute_params) / (m.num_experts - m.experts_per_token)
        return m.num_experts * per_expert * (m.weight_bytes_per_param or m.dtype_bytes)

    def weight_bytes_per_gpu(self) -> float:
        """Bytes of weights one GPU holds: weights / tp, or with expert parallelism the dense part / tp
        and the experts / (tp x dp)."""
        if not self.ep:
            return self.model.weight_bytes / self.tp
        experts = self.expert_weight_bytes
        return (self.model.weight_bytes - experts) / self.tp + experts / (self.tp * self.dp)

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
        per_gpu = self.kv_memory_per_gpu(gpu_mem_util, max_batched_tokens)
        return _bounded(int(math.floor(per_gpu * self.tp / per_token)), f"--tp {self.tp}")

    def memory_ledger(self, gpu_mem_util: float = 0.9, max_batched_tokens: int = 8192) -> MemoryLedger:
        """One GPU's memory split as vLLM's start-up profiling logs it (`MemoryLedger`)."""
        if not 0 < gpu_mem_util <= 1:
            raise ValueError(f"--gpu-mem-util must be in (0, 1], got {gpu_mem_util}")
        reserve = activation_reserve_bytes(self.model, max_batched_tokens)
        return MemoryLedger(float(self.gpu.memory_bytes), gpu_mem_util, self.weight_bytes_per_gpu(),
                            reserve - NON_TORCH_RESERVE_BYTES, float(NON_TORCH_RESERVE_BYTES))

    def kv_memory_per_gpu(self, gpu_mem_util: float = 0.9, max_batched_tokens: int = 8192) -> float:
        """Bytes each GPU leaves for the KV cache: its memory x `gpu_mem_util` minus its share of the
        weights and `activation_reserve_bytes(model, max_batched_tokens)` (vLLM's available KV memory)."""
        ledger = self.memory_ledger(gpu_mem_util, max_batched_tokens)
        per_gpu = ledger.kv
        if per_gpu <= 0:
            raise ValueError(f"{self.model.name} on {self.tp} x {self.gpu.name} at gpu-mem-util "
                             f"{gpu_mem_util}: weights leave no memory for the KV cache (per GPU: {ledger.weights / GIB:.2f} "
                             f"GiB of weights + {(ledger.activation_peak + ledger.non_torch) / GIB:.2f} GiB of "
                             f"activations and runtime of {ledger.budget / GIB:.2f} GiB; a larger --tp splits the "
                             "weights)")
        return per_gpu


def _bounded(capacity_tokens: int, source: str) -> int:
    """`capacity_tokens`, or a ValueError naming the flag (`source`) when it passes MAX_CAPACITY_TOKENS."""
    if capacity_tokens > MAX_CAPACITY_TOKENS:
        raise ValueError(f"{source}: {capacity_tokens:.3g} KV token slots is more than kvsim models "
                         f"(at most 2^50 = {MAX_CAPACITY_TOKENS:.3g})")
    return capacity_tokens
