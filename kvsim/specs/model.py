"""A model's shape as far as the KV cache and the cost model need it (`ModelSpec`), and the units.

Units: bytes, tokens (KV slots), FLOP/s and bytes/s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvsim.specs.layers import LayerGroup

GIB = 1024**3

#: vLLM's `--kv-cache-dtype` choices and their bytes per element (`auto`: the model's dtype).
KV_CACHE_DTYPES = {"auto": None, "fp16": 2, "bf16": 2, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1}


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape, as far as the KV cache and the cost model need it.

    `num_params` counts every weight (all experts of a MoE model); `active_params` the weights one
    token runs through (None: all of them). `dtype_bytes` is the activation/compute dtype;
    `weight_bytes_per_param` that of quantized weights (None: dtype_bytes), applied to all but
    `unquantized_params` (embeddings and LM head, which quantized checkpoints keep in dtype_bytes);
    `kv_dtype_bytes` that of the KV cache (None: dtype_bytes). `num_experts`/`experts_per_token`: routed
    experts per MoE layer and those each token uses (0 for a dense model). `layer_groups`: the layers that
    keep a cache, by kind (`kvsim.specs.layers`; MLP-only layers such as Nemotron-H's keep none and are
    counted in `num_layers` only); empty means every layer is full attention with `num_kv_heads` x
    `head_dim` (the models of 2023), and then nothing else changes."""

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
    layer_groups: tuple[LayerGroup, ...] = ()
    quant_method: str | None = None     # a quantized checkpoint's own `quantization_config.quant_method`

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
        if sum(g.num_layers for g in self.layer_groups) > self.num_layers:
            raise ValueError(f"ModelSpec {self.name!r}: layer_groups hold "
                             f"{sum(g.num_layers for g in self.layer_groups)} layers, more than num_layers = "
                             f"{self.num_layers}")

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
        as vLLM does). With `layer_groups`: the sum over the attention and MLA layers as if every one
        kept every token (full-attention sizing; Mamba layers hold no per-token KV)."""
        if self.layer_groups:
            return sum(g.bytes_per_token(tp, self.kv_bytes) for g in self.layer_groups)
        return 2 * self.num_layers * max(1, self.num_kv_heads // tp) * self.head_dim * self.kv_bytes

    @property
    def groups(self) -> tuple[LayerGroup, ...]:
        """The layers by kind: `layer_groups`, or one group of full attention when it is empty."""
        return self.layer_groups or (LayerGroup("full", self.num_layers, self.num_kv_heads, self.head_dim),)

    @property
    def is_hybrid(self) -> bool:
        """Whether any layer is other than plain full attention (sliding, chunked, MLA, Mamba): vLLM's
        start-up figures then come from `kvsim.specs.kv_groups`."""
        return any(g.kind != "full" for g in self.layer_groups)

    def state_bytes_per_request(self, tp: int = 1) -> int:
        """Bytes of one request's Mamba / linear-attention state in all such layers on one of `tp` GPUs."""
        return sum(g.state_bytes_per_request(tp) for g in self.layer_groups)

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


def find_preset(table: dict, name: str, what: str):
    """`table[name.lower()]`, or a ValueError naming `what` and listing the known names."""
    key = name.lower()
    if key not in table:
        raise ValueError(f"unknown {what} {name!r}; known: {', '.join(table)}")
    return table[key]
