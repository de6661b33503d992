"""Time the hybrid-model decode kernels at real shapes against their bytes model (`bench`).

Per shape and context L: the sliding-window (or chunked-local) decode over a table whose blocks before
the window (chunk) are null, as the hybrid KV cache manager leaves them, next to full-attention paged
decode over all L tokens at the same shape, and MLA decode over DeepSeek-V3's latent. A window kernel
that reads only its window keeps its time flat in L past W; its GB/s counts the bytes of the tokens it
attends to only. Block ids are unique (a permutation), splits follow the kernels' heuristic (given the
context, so no device sync is timed), times are `bench.median_time_s` medians.

Shapes (config.json of each model): gpt-oss-120b 64 query / 8 KV heads, head_dim 64, sliding_window
128; gemma-3-27b 32 / 16 heads, head_dim 128, sliding_window 1024; llama-4-scout 40 / 8 heads,
head_dim 128, attention_chunk_size 8192; DeepSeek-V3 128 heads,
kv_lora_rank 512, qk_rope_head_dim 64 (softmax scale: check_hybrid.DEEPSEEK_V3_SCALE).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gpu_harness import bench, layout
from gpu_harness.backend import Backend


@dataclass(frozen=True, slots=True)
class HybridShape:
    """One model's attention: sliding window (window > 0: q/kv heads, head_dim; `chunked`: window is a
    local-attention chunk) or MLA (rank, rope)."""

    name: str
    q_heads: int
    kv_heads: int = 1
    head_dim: int = 0
    window: int = 0
    rank: int = 0
    rope: int = 0
    block_size: int = 16
    chunked: bool = False


GPU_SHAPES = (HybridShape("gpt-oss-120b", 64, 8, 64, window=128),
              HybridShape("gemma-3-27b", 32, 16, 128, window=1024),
              HybridShape("llama-4-scout", 40, 8, 128, window=8192, chunked=True),
              HybridShape("deepseek-v3", 128, rank=512, rope=64, block_size=64))
CPU_SHAPES = (HybridShape("tiny-window", 4, 2, 64, window=8, block_size=8),
              HybridShape("tiny-chunk", 4, 2, 64, window=16, block_size=8, chunked=True),
              HybridShape("tiny-mla", 16, rank=32, rope=16, block_size=8))
GPU_POINTS = (32, (1024, 4096, 16384))  # batch, contexts
CPU_POINTS = (2, (16, 48))


def _unique_ids(count: int, gen: torch.Generator) -> list[int]:
    return torch.randperm(count, generator=gen).tolist()


def _row(kernel: str, s: HybridShape, batch: int, context: int, span: int | None, splits: int,
         seconds: float, nbytes: int) -> dict:
    return {"kernel": kernel, "shape": s.name, "batch": batch, "context": context,
            "window": None if s.chunked else span, "chunk": span if s.chunked else None, "splits": splits,
            "median_s": seconds, "bytes": nbytes, "bytes_per_s": nbytes / seconds}


def _window_points(s: HybridShape, batch: int, context: int, dev: str, on_gpu: bool, gen) -> list[dict]:
    from gpu_harness.kernels import paged_decode
    from gpu_harness.kernels.decode_common import resolve_splits
    from gpu_harness.kernels.heuristics import head_programs
    bs, elem = s.block_size, 2
    total = layout.blocks_needed(context, bs)
    ids = _unique_ids(batch * total, gen)
    full_tables = [ids[i * total:(i + 1) * total] for i in range(batch)]
    window_tables = layout.null_out_of_window(full_tables, [context] * batch, bs, s.window, chunked=s.chunked)
    kc, vc = layout.alloc_paged_cache(batch * total, bs, s.kv_heads, s.head_dim, torch.bfloat16, dev, "randn")
    q = torch.randn(batch, s.q_heads, s.head_dim, device=dev, dtype=torch.bfloat16)
    sl = layout.make_seq_lens([context] * batch, dev)
    programs = s.kv_heads * head_programs(s.q_heads // s.kv_heads)
    rows = []
    local = "chunk" if s.chunked else "window"
    start = layout.chunk_start(context, s.window) if s.chunked else layout.window_start(context, s.window)
    points = (("paged_decode", full_tables, None), (f"{local}_decode", window_tables, s.window))
    for kernel, tables, span in points:
        bt = layout.make_block_table(tables, dev)
        splits = resolve_splits(q, programs, sl, None, context, span)
        spans = {} if span is None else {local: span}
        t = bench.median_time_s(lambda: paged_decode(q, kc, vc, bt, sl, num_splits=splits, **spans), on_gpu)
        tokens = context if span is None else context - start  # a window: min(L, W), as window_decode_bytes
        nbytes = bench.decode_bytes(batch, tokens, s.q_heads, s.kv_heads, s.head_dim, elem, bs, splits)
        rows.append(_row(kernel, s, batch, context, span, splits, t, nbytes))
    return rows


def _mla_point(s: HybridShape, batch: int, context: int, dev: str, on_gpu: bool, gen) -> dict:
    from gpu_harness.check_hybrid import DEEPSEEK_V3_SCALE
    from gpu_harness.kernels import mla_decode
    from gpu_harness.kernels.decode_common import resolve_splits
    from gpu_harness.kernels.heuristics import head_programs
    bs = s.block_size
    total = layout.blocks_needed(context, bs)
    ids = _unique_ids(batch * total, gen)
    bt = layout.make_block_table([ids[i * total:(i + 1) * total] for i in range(batch)], dev)
    kv = torch.randn(batch * total, bs, s.rank + s.rope, device=dev, dtype=torch.bfloat16)
    q = torch.randn(batch, s.q_heads, s.rank + s.rope, device=dev, dtype=torch.bfloat16)
    sl = layout.make_seq_lens([context] * batch, dev)
    splits = resolve_splits(q, head_programs(s.q_heads), sl, None, context)
    t = bench.median_time_s(lambda: mla_decode(q, kv, bt, sl, kv_lora_rank=s.rank, scale=DEEPSEEK_V3_SCALE,
                                               num_splits=splits), on_gpu)
    nbytes = bench.mla_decode_bytes(batch, context, s.q_heads, s.rank, s.rope, 2, bs, splits)
    return _row("mla_decode", s, batch, context, None, splits, t, nbytes)


def run_hybrid_bench(backend: Backend, seed: int = 0) -> dict:
    """Measurements of the hybrid kernels (bf16): real shapes on a GPU, tiny ones on the interpreter."""
    gen = torch.Generator().manual_seed(seed)
    on_gpu = not backend.interpret
    shapes, (batch, contexts) = (GPU_SHAPES, GPU_POINTS) if on_gpu else (CPU_SHAPES, CPU_POINTS)
    rows = []
    for s in shapes:
        for context in contexts:
            if s.window:
                rows += _window_points(s, batch, context, backend.device, on_gpu, gen)
            else:
                rows.append(_mla_point(s, batch, context, backend.device, on_gpu, gen))
    return {"device": backend.name, "backend": backend.kind, "dtype": "bfloat16", "measurements": rows}
