"""A model's layers by kind (`LayerGroup`): what each kind keeps in the KV cache, per GPU.

Kinds (DESIGN.md "Heterogeneous layers"):
- `full`: K and V of every token, `num_kv_heads` x `head_dim` each;
- `sliding`: the same per token, but only the last `window` tokens are attended (and kept);
- `chunked`: chunked local attention, tokens of the current `chunk`-token chunk only (Llama 4);
- `mla`: multi-head latent attention, one latent of `latent_dim` (kv_lora_rank + qk_rope_head_dim)
  values per token, the same on every tensor-parallel rank (vLLM's MLAAttentionSpec: one KV head,
  max_tp_shards 1);
- `mamba`: a Mamba / linear-attention state of fixed size per request, no per-token growth.

Units: bytes, tokens, values (elements).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

KINDS = ("full", "sliding", "chunked", "mla", "mamba")
ATTENTION_KINDS = ("full", "sliding", "chunked")


@dataclass(frozen=True, slots=True)
class MambaState:
    """One Mamba / linear-attention layer's state per request, before tensor parallelism.

    `conv_dim` x (`conv_kernel` - 1) values of convolution state in `conv_dtype_bytes`, and
    `ssm_heads` x `ssm_shape` values of recurrent (SSM / delta-rule) state in `ssm_dtype_bytes`.
    Tensor parallelism splits `conv_dim` and `ssm_heads` (vLLM's MambaStateShapeCalculator:
    mamba2_state_shape, gated_delta_net_state_shape); `extra_conv_per_tp_group` adds the group
    replication vLLM's mamba2_state_shape makes when n_groups is not a multiple of the TP degree
    (`n_groups` and `ssm_state_size` give it; 0 for gated delta nets)."""

    conv_dim: int
    conv_kernel: int
    ssm_heads: int
    ssm_shape: tuple[int, ...]
    conv_dtype_bytes: int
    ssm_dtype_bytes: int
    n_groups: int = 0
    group_state_size: int = 0

    def __post_init__(self) -> None:
        for field in ("conv_dim", "conv_kernel", "ssm_heads", "conv_dtype_bytes", "ssm_dtype_bytes"):
            if getattr(self, field) < 1:
                raise ValueError(f"MambaState: {field} must be >= 1, got {getattr(self, field)}")
        if not self.ssm_shape or any(d < 1 for d in self.ssm_shape):
            raise ValueError(f"MambaState: ssm_shape must be positive sizes, got {self.ssm_shape}")
        if self.n_groups < 0 or self.group_state_size < 0:
            raise ValueError("MambaState: n_groups and group_state_size must be >= 0")

    def shapes(self, tp: int) -> tuple[tuple[int, int], tuple[int, ...]]:
        """(conv state shape, SSM state shape) on one of `tp` GPUs; ValueError when tp does not split
        them evenly (vLLM's `divide` asserts the same)."""
        extra = 0
        if self.n_groups and self.n_groups % tp:
            extra = 2 * (tp - self.n_groups) * self.group_state_size   # groups replicated per head shard
        conv_dim = self.conv_dim + extra
        if conv_dim % tp or self.ssm_heads % tp:
            raise ValueError(f"--tp {tp}: the Mamba state (conv dim {conv_dim}, {self.ssm_heads} heads) "
                             f"cannot be split evenly over {tp} GPUs")
        return (conv_dim // tp, self.conv_kernel - 1), (self.ssm_heads // tp, *self.ssm_shape)

    def bytes_per_gpu(self, tp: int) -> int:
        """Bytes of one request's state in one layer on one of `tp` GPUs."""
        conv, ssm = self.shapes(tp)
        return prod(conv) * self.conv_dtype_bytes + prod(ssm) * self.ssm_dtype_bytes


@dataclass(frozen=True, slots=True)
class LayerGroup:
    """`num_layers` layers of one `kind` (see the module docstring). Attention kinds (`full`, `sliding`,
    `chunked`) need `num_kv_heads` and `head_dim`; `sliding` a `window` (tokens), `chunked` a `chunk`
    (tokens); `mla` a `latent_dim` (values per token per layer); `mamba` a `state`."""

    kind: str
    num_layers: int
    num_kv_heads: int = 0
    head_dim: int = 0
    window: int | None = None
    chunk: int | None = None
    latent_dim: int = 0
    state: MambaState | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"LayerGroup: unknown kind {self.kind!r}; known: {', '.join(KINDS)}")
        if self.num_layers < 1:
            raise ValueError(f"LayerGroup {self.kind}: num_layers must be >= 1, got {self.num_layers}")
        attention = self.kind in ATTENTION_KINDS
        if attention and (self.num_kv_heads < 1 or self.head_dim < 1):
            raise ValueError(f"LayerGroup {self.kind}: num_kv_heads and head_dim must be >= 1, got "
                             f"{self.num_kv_heads} and {self.head_dim}")
        if not attention and (self.num_kv_heads or self.head_dim):
            raise ValueError(f"LayerGroup {self.kind}: num_kv_heads/head_dim are for attention kinds only")
        if (self.kind == "sliding") != (self.window is not None):
            raise ValueError(f"LayerGroup {self.kind}: a window (tokens) is given for sliding layers only")
        if self.window is not None and self.window < 1:
            raise ValueError(f"LayerGroup sliding: window must be >= 1 token, got {self.window}")
        if (self.kind == "chunked") != (self.chunk is not None):
            raise ValueError(f"LayerGroup {self.kind}: a chunk (tokens) is given for chunked layers only")
        if self.chunk is not None and self.chunk < 1:
            raise ValueError(f"LayerGroup chunked: chunk must be >= 1 token, got {self.chunk}")
        if (self.kind == "mla") != (self.latent_dim > 0) or self.latent_dim < 0:
            raise ValueError(f"LayerGroup {self.kind}: latent_dim (> 0) is given for mla layers only")
        if (self.kind == "mamba") != (self.state is not None):
            raise ValueError(f"LayerGroup {self.kind}: a state is given for mamba layers only")

    def heads_per_gpu(self, tp: int) -> int:
        """KV heads one of `tp` GPUs holds per layer: kv_heads / tp, at least one (replicated when tp
        exceeds them); MLA's one latent "head" on every GPU; 0 for Mamba."""
        if self.kind == "mla":
            return 1
        if self.kind == "mamba":
            return 0
        return max(1, self.num_kv_heads // tp)

    def page_bytes_per_token(self, tp: int, kv_bytes: int) -> int:
        """Bytes one token takes in ONE layer of this group on one of `tp` GPUs (`kv_bytes` per element):
        K and V for attention, the latent for MLA, 0 for Mamba (vLLM's page_size_bytes at block_size 1)."""
        if self.kind == "mla":
            return self.latent_dim * kv_bytes
        if self.kind == "mamba":
            return 0
        return 2 * self.heads_per_gpu(tp) * self.head_dim * kv_bytes

    def bytes_per_token(self, tp: int, kv_bytes: int) -> int:
        """Bytes one token takes in all layers of this group on one GPU (0 for Mamba)."""
        return self.num_layers * self.page_bytes_per_token(tp, kv_bytes)

    def state_bytes_per_request(self, tp: int) -> int:
        """Bytes of one request's Mamba state in all layers of this group on one GPU (0 otherwise)."""
        return 0 if self.state is None else self.num_layers * self.state.bytes_per_gpu(tp)

    def check_tp(self, tp: int, model: str) -> None:
        """ValueError when `tp` GPUs cannot hold this group's KV heads or state evenly (as vLLM)."""
        if self.kind in ATTENTION_KINDS and self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ValueError(f"--tp {tp}: {model}'s {self.num_kv_heads} KV heads ({self.kind} layers) can be "
                             f"neither split evenly nor replicated evenly over {tp} GPUs")
        if self.state is not None:
            self.state.shapes(tp)


def describe(groups: tuple[LayerGroup, ...]) -> str:
    """'18 sliding (W 128) + 18 full' — the layer mix in words."""
    parts = []
    for g in groups:
        extra = (f" (W {g.window})" if g.window else f" (chunk {g.chunk})" if g.chunk else "")
        parts.append(f"{g.num_layers} {g.kind}{extra}")
    return " + ".join(parts)
