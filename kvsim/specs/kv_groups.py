"""vLLM 0.33's KV cache plan for a model of mixed layer kinds, and the start-up figures it logs.

Computed our own way, by the rules of vLLM 0.33 (files under vllm/):
- block size: `--block-size`; with Mamba layers beside attention, raised until one attention page
  covers a Mamba state, in steps of the kernel block (platforms/interface.py `_align_hybrid_block_size`),
  and the Mamba page padded to the attention page;
- grouping (v1/core/kv_cache_planning.py `get_kv_cache_groups`): one group when every layer has the
  same spec or kind; else layers bucketed by spec, every bucket split into groups of `group_size`
  layers (the smallest bucket's count, or the largest's when it is under 1.5x the smallest), padding
  the last group of a bucket; `--disable-hybrid-kv-cache-manager` first turns sliding and chunked
  layers into full attention (`unify_hybrid_kv_cache_specs`);
- num_blocks = KV bytes per GPU // bytes per block, a block being the largest group's pages
  (`_get_kv_cache_bytes_per_block`); with `--num-gpu-blocks-override`, that number;
- blocks one request at max_model_len L needs per group (kv_cache_interface.py
  `max_memory_usage_bytes`): full/MLA ceil(L / B); sliding ceil(min(W - 1 + F, L) / B) + 1 and chunked
  ceil(min(C + F, L) / B), F being the tokens in flight (max_concurrent_batches x
  max_num_batched_tokens, vllm/config/vllm.py `max_in_flight_tokens`); Mamba 1 state block (2 with
  prefix caching, its "align" mode);
- "Maximum concurrency" = num_blocks / the sum over groups; "GPU KV cache size" =
  int(concurrency x L) tokens (v1/core/kv_cache_utils.py `get_kv_cache_capacity`).
Units: bytes, tokens, blocks. No SimPy, no vLLM import.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.specs.model import ModelSpec

#: Batches in flight at once: vLLM 0.33 turns async scheduling on by default, so two
#: (vllm/config/vllm.py `max_concurrent_batches` with pipeline parallelism 1).
MAX_CONCURRENT_BATCHES = 2
#: Smallest kernel block of the CUDA attention backends (FlashAttention, Triton: `MultipleOf(16)`,
#: v1/attention/backends/flash_attn.py `get_supported_kernel_block_sizes`).
KERNEL_BLOCK_TOKENS = 16
#: Block-size step for MLA + Mamba models (TRTLLM/FlashInfer MLA kernels; `_align_hybrid_block_size`).
MLA_MAMBA_BLOCK_TOKENS = 128


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class KVCacheGroup:
    """One KV cache group: `num_layers` layers of one kind (plus `padding_layers` empty slots to make
    every group the same size), one block table per request, pages of `page_bytes` per layer, blocks of
    `block_size` tokens (attention) and `blocks_per_request` blocks for one max-length request."""

    kind: str
    num_layers: int
    padding_layers: int
    page_bytes: int
    block_size: int
    blocks_per_request: int
    window: int | None = None
    chunk: int | None = None


@dataclass(frozen=True, slots=True)
class KVCachePlan:
    """vLLM's KV cache for one GPU: attention `block_size` (tokens), the `groups`, `bytes_per_block`
    (all groups' pages for one block id), `num_blocks` in the shared pool, and the start-up figures
    `max_concurrency` (requests of `max_model_len` tokens) and `capacity_tokens` ("GPU KV cache size").
    `hybrid`: whether vLLM's hybrid KV cache manager is on; `note`: why it is off, if it is."""

    block_size: int
    groups: tuple[KVCacheGroup, ...]
    bytes_per_block: int
    num_blocks: int
    max_model_len: int
    blocks_per_request: int
    max_concurrency: float
    capacity_tokens: int
    hybrid: bool
    note: str = ""


def _hybrid_default(model: ModelSpec, hybrid: bool | None) -> tuple[bool, str]:
    """vLLM's choice: on, except for chunked local attention, where it turns the manager off by
    default (config/vllm.py: "latency regression", VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE)."""
    chunked = any(g.kind == "chunked" for g in model.groups)
    if hybrid is None:
        if chunked:
            return False, ("vLLM 0.33 turns its hybrid KV cache manager off for chunked local attention "
                           "(--hybrid-kv-cache: as with VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=1)")
        return True, ""
    return hybrid, "" if hybrid else "--no-hybrid-kv-cache: every layer sized as full attention"


def _block_size(model: ModelSpec, tp: int, block_size: int) -> tuple[int, int | None]:
    """(attention block size, padded Mamba page bytes or None): `_align_hybrid_block_size`."""
    groups = model.groups
    states = [g.state.bytes_per_gpu(tp) for g in groups if g.kind == "mamba"]
    attention = [g for g in groups if g.kind != "mamba"]
    if not states or not attention:
        return block_size, None
    page_1 = attention[0].page_bytes_per_token(tp, model.kv_bytes)
    step = max(KERNEL_BLOCK_TOKENS, block_size)
    if any(g.kind == "mla" for g in attention):
        step = max(step, MLA_MAMBA_BLOCK_TOKENS)
    needed = step * _cdiv(max(states), step * page_1)
    needed = KERNEL_BLOCK_TOKENS * _cdiv(needed, KERNEL_BLOCK_TOKENS)
    block_size = max(block_size, needed)
    return block_size, block_size * page_1


def _raised(model: ModelSpec, tp: int, asked: int, block_size: int) -> str:
    """Why the attention block size is `block_size`, not the `asked` one (`_block_size`), with the figures."""
    state = max(g.state.bytes_per_gpu(tp) for g in model.groups if g.kind == "mamba")
    page_1 = next(g for g in model.groups if g.kind != "mamba").page_bytes_per_token(tp, model.kv_bytes)
    return (f"block size {block_size} tokens, not {asked}: vLLM raises the attention block size until one "
            f"attention page ({page_1:,} bytes per token per GPU x block) holds a request's Mamba state "
            f"({state:,} bytes per GPU at TP {tp}), in steps of the kernel's block, then pads the Mamba page "
            f"to match (platforms/interface.py `_align_hybrid_block_size`)")


def exports_prefill_checkpoints(model: ModelSpec) -> bool:
    """Whether every Mamba layer of `model` exports a state from inside a prefill chunk, as vLLM 0.33's
    Mamba-2 mixer declares (`MambaMixer2.get_kv_cache_spec`: one prefill checkpoint block; Mamba-2 state
    shapes have `n_groups` >= 1); vLLM takes such checkpoints only when every Mamba layer can
    (`get_mamba_prefill_checkpoint_alignment`). Not Mamba-1 (Jamba), nor the gated delta net (Qwen3-Next)
    on its Triton prefill kernel (kvsim/alloc/hybrid/mamba.py)."""
    states = [g.state for g in model.groups if g.kind == "mamba"]
    return bool(states) and all(s.n_groups > 0 for s in states)


def blocks_per_request(kind: str, window: int | None, chunk: int | None, block_size: int, max_len: int,
                       in_flight: int, prefix_caching: bool, checkpoints: bool = False) -> int:
    """Blocks one max-length request needs in one group of `kind` (vLLM's max_memory_usage_bytes; a Mamba
    group with prefix caching: two states, plus a prefill checkpoint block for `checkpoints`)."""
    if kind == "sliding":
        return _cdiv(min(window - 1 + in_flight, max_len), block_size) + 1
    if kind == "chunked":
        return _cdiv(min(chunk + in_flight, max_len), block_size)
    if kind == "mamba":
        return (3 if checkpoints else 2) if prefix_caching else 1
    return _cdiv(max_len, block_size)


def _buckets(model: ModelSpec, tp: int, block_size: int, hybrid: bool, mamba_page: int | None) -> list[list]:
    """[kind, window, chunk, page bytes, layers] per distinct layer spec, in layer-group order (a page:
    one block of one layer); without the hybrid manager, sliding and chunked layers become full
    attention when full layers exist."""
    kinds = {g.kind for g in model.groups}
    promote = not hybrid and kinds & {"full", "mla"} and kinds & {"sliding", "chunked"}
    buckets: dict[tuple, list] = {}
    for g in model.groups:
        kind, window, chunk = g.kind, g.window, g.chunk
        if promote and kind in ("sliding", "chunked"):
            kind, window, chunk = "full", None, None
        if kind == "mamba":
            page = mamba_page or g.state.bytes_per_gpu(tp)
        else:
            page = g.page_bytes_per_token(tp, model.kv_bytes) * block_size
        key = (kind, window, chunk, page)
        buckets.setdefault(key, [kind, window, chunk, page, 0])[4] += g.num_layers
    return list(buckets.values())


def plan_kv_cache(model: ModelSpec, tp: int = 1, block_size: int = 16, *,
                  kv_bytes_per_gpu: int | None = None, num_blocks: int | None = None,
                  max_num_batched_tokens: int = 8192, hybrid: bool | None = None,
                  prefix_caching: bool = False,
                  max_concurrent_batches: int = MAX_CONCURRENT_BATCHES) -> KVCachePlan:
    """vLLM 0.33's KV cache plan for `model` on one of `tp` GPUs with `kv_bytes_per_gpu` bytes of KV
    memory (or exactly `num_blocks` blocks), `--block-size` `block_size`, `--max-num-batched-tokens`,
    `hybrid` (None: vLLM's default; False: `--disable-hybrid-kv-cache-manager`) and prefix caching.
    ValueError where vLLM refuses to start (Mamba layers without the hybrid manager, attention pages it
    cannot unify, not one max-length request fitting)."""
    if (kv_bytes_per_gpu is None) == (num_blocks is None):
        raise ValueError("plan_kv_cache: give kv_bytes_per_gpu or num_blocks, not both or neither")
    if block_size < 1 or max_num_batched_tokens < 1:
        raise ValueError("block size and --max-num-batched-tokens must be >= 1")
    hybrid, note = _hybrid_default(model, hybrid)
    if not hybrid and any(g.kind == "mamba" for g in model.groups):
        raise ValueError(f"--no-hybrid-kv-cache: {model.name} has Mamba / linear-attention layers, which "
                         "vLLM 0.33 serves only with its hybrid KV cache manager (it fails at start-up "
                         "with --disable-hybrid-kv-cache-manager)")
    asked = block_size
    block_size, mamba_page = _block_size(model, tp, block_size)
    if block_size != asked:
        note = "; ".join(filter(None, (note, _raised(model, tp, asked, block_size))))
    max_len, in_flight = model.max_seq_len, max_concurrent_batches * max_num_batched_tokens
    buckets = _buckets(model, tp, block_size, hybrid, mamba_page)
    ckpt = exports_prefill_checkpoints(model)

    def needed(b) -> int:
        return blocks_per_request(b[0], b[1], b[2], block_size, max_len, in_flight, prefix_caching, ckpt)

    if len({(b[0], b[1], b[2]) for b in buckets}) == 1:      # one kind: one group of every layer
        layers = sum(b[4] for b in buckets)
        groups = (KVCacheGroup(buckets[0][0], layers, 0, buckets[0][3], block_size, needed(buckets[0]),
                               buckets[0][1], buckets[0][2]),)
        bytes_per_block = sum(b[3] * b[4] for b in buckets)
    else:
        pages = {b[3] for b in buckets}
        if len(pages) > 1:
            raise ValueError(f"{model.name}: layers of different kinds with different page sizes "
                             f"({sorted(pages)} bytes per block per layer) are not modelled (vLLM pads or "
                             "packs them)")
        counts = [b[4] for b in buckets]
        group_size = min(counts) if max(counts) >= 1.5 * min(counts) else max(counts)
        groups_list = []
        for kind, window, chunk, page, count in buckets:
            n = _cdiv(count, group_size)
            for i in range(n):                                 # vLLM: layers[i::n]
                size = count // n + (1 if i < count % n else 0)
                groups_list.append(KVCacheGroup(kind, size, group_size - size, page, block_size,
                                                needed([kind, window, chunk]), window, chunk))
        groups = tuple(groups_list)
        bytes_per_block = group_size * pages.pop()
    per_request = sum(g.blocks_per_request for g in groups)
    if num_blocks is None:
        num_blocks = kv_bytes_per_gpu // bytes_per_block
    if num_blocks - 1 < 1:                    # not even one block besides the null block
        raise ValueError(f"{model.name}: one KV block ({bytes_per_block:,} bytes per GPU: the model's KV bytes "
                         f"per token x --block-size {block_size}) is more than the KV memory holds; give "
                         "more KV memory (--kv-gib, --gpu-mem-util, --tp) or check the model's KV shape")
    if num_blocks - 1 < per_request:          # vLLM keeps the null block back in this check
        raise ValueError(f"{model.name}: one request of max_model_len {max_len} needs {per_request} "
                         f"blocks of {bytes_per_block:,} bytes per GPU, more than the "
                         f"{max(num_blocks - 1, 0)} the KV memory holds (lower --max-model-len)")
    if any(g.kind == "mla" for g in groups) and block_size % 64:
        note = "; ".join(filter(None, (note, "vLLM's MLA backends may fix the block size (FlashMLA: 64 "
                                       "tokens) when --block-size is not given; kvsim uses the one given")))
    concurrency = num_blocks / per_request
    return KVCachePlan(block_size, groups, bytes_per_block, num_blocks, max_len, per_request, concurrency,
                       int(concurrency * max_len), hybrid, note)
