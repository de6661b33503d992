"""Time the decode and store kernels over a grid, fit the cost model's parameters, and build the
`kvsim-calibration/1` document (docs/calibration-format.md).

Grid: `paged_decode` at block sizes 8, 16, 32 with sequential and permuted block tables (unique ids,
so no L2 reuse between sequences), `contiguous_decode` (same heuristics, no indirection) and `store_kv`
(scattered unique slots). Measurement `bytes` is the full HBM traffic of KERNELS.md section 5.

Fit, in the units kvsim/cost/roofline.py uses (per layer; rates are bytes of KV, K and V, per second):
- `decode_attn_*`: least squares of contiguous-kernel time on KV bytes read (batch x context x K+V bytes
  per token); Q/O and split partials fall into the fixed term;
- `paged_overhead[bs]`: geometric mean over points of paged (permuted table) / contiguous time, since a
  long-running allocator hands out scattered blocks;
- `store_kv_*`: least squares of time on the KV bytes of the new tokens (each is read and written, so
  this rate is about half the raw traffic rate).
"""

from __future__ import annotations

import datetime as dt
import math
import platform
from dataclasses import dataclass

import numpy as np
import torch

from gpu_harness import bench, layout
from gpu_harness.backend import Backend

BLOCK_SIZES = (8, 16, 32)
FORMAT = "kvsim-calibration/1"


@dataclass(frozen=True, slots=True)
class Grid:
    """Attention shape and the points to time (decode: batch x context; store: token counts)."""

    q_heads: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    store_tokens: tuple[int, ...]
    max_tokens: int  # skip decode points with batch x context above this (memory)
    copy_bytes: int


#: Llama-3-8B's attention shape (32 query heads, 8 KV heads, D 128, bf16) on a GPU; tiny on the interpreter.
GPU_GRID = Grid(32, 8, 128, torch.bfloat16, (1, 4, 16, 64, 256), (512, 2048, 8192, 32768),
                (1, 16, 256, 4096, 16384), 1 << 20, 1 << 30)
GPU_QUICK = Grid(32, 8, 128, torch.bfloat16, (1, 16, 64), (1024, 4096), (16, 4096), 1 << 18, 1 << 28)
CPU_GRID = Grid(4, 2, 64, torch.bfloat16, (1, 2), (16, 48), (2, 16), 1 << 10, 1 << 24)


def _measurement(kernel, block_size, table, batch, context, splits, seconds, nbytes) -> dict:
    return {"kernel": kernel, "block_size": block_size, "table": table, "batch": batch, "context": context,
            "splits": splits, "median_s": seconds, "bytes": nbytes, "bytes_per_s": nbytes / seconds}


def _decode_point(g: Grid, batch: int, context: int, backend: Backend, gen: torch.Generator) -> list[dict]:
    from gpu_harness.kernels import contiguous_decode, heuristics, paged_decode
    from gpu_harness.kernels.decode_common import resolve_splits
    dev, on_gpu, elem = backend.device, not backend.interpret, g.dtype.itemsize
    q = torch.randn((batch, g.q_heads, g.head_dim), device=dev).to(g.dtype)
    seq_lens = layout.make_seq_lens([context] * batch, dev)
    programs = g.kv_heads * heuristics.head_programs(g.q_heads // g.kv_heads)
    splits = resolve_splits(q, programs, seq_lens, None, context)
    rows = []
    k = torch.randn((batch, context, g.kv_heads, g.head_dim), device=dev).to(g.dtype)
    v = torch.randn_like(k)
    t = bench.median_time_s(lambda: contiguous_decode(q, k, v, seq_lens, num_splits=splits), on_gpu)
    nbytes = bench.decode_bytes(batch, context, g.q_heads, g.kv_heads, g.head_dim, elem, None, splits)
    rows.append(_measurement("contiguous_decode", None, None, batch, context, splits, t, nbytes))
    del k, v
    for bs in BLOCK_SIZES:
        lens = [context] * batch
        num_blocks = batch * layout.blocks_needed(context, bs)
        kc, vc = layout.alloc_paged_cache(num_blocks, bs, g.kv_heads, g.head_dim, g.dtype, dev, fill="randn")
        nbytes = bench.decode_bytes(batch, context, g.q_heads, g.kv_heads, g.head_dim, elem, bs, splits)
        for name, tables in (("sequential", layout.sequential_tables(lens, bs)),
                             ("permuted", layout.permuted_tables(lens, bs, gen))):
            bt = layout.make_block_table(tables, dev)
            t = bench.median_time_s(lambda: paged_decode(q, kc, vc, bt, seq_lens, num_splits=splits), on_gpu)
            rows.append(_measurement("paged_decode", bs, name, batch, context, splits, t, nbytes))
        del kc, vc
    return rows


def _store_point(g: Grid, num_tokens: int, backend: Backend, gen: torch.Generator) -> dict:
    from gpu_harness.kernels import store_kv
    bs, dev = 16, backend.device
    num_blocks = 2 * layout.blocks_needed(num_tokens, bs)
    kc, vc = layout.alloc_paged_cache(num_blocks, bs, g.kv_heads, g.head_dim, g.dtype, dev)
    slots = torch.randperm(num_blocks * bs, generator=gen)[:num_tokens].to(dev)  # unique, scattered
    key = torch.randn((num_tokens, g.kv_heads, g.head_dim), device=dev).to(g.dtype)
    value = torch.randn_like(key)
    t = bench.median_time_s(lambda: store_kv(key, value, kc, vc, slots), not backend.interpret)
    nbytes = bench.store_bytes(num_tokens, g.kv_heads, g.head_dim, g.dtype.itemsize)
    return _measurement("store_kv", bs, None, num_tokens, None, None, t, nbytes)


def _linear_fit(points: list[dict], kv_token_bytes: int) -> tuple[float, float]:
    """(fixed_s, bytes_per_s) of time = fixed + kv_bytes / rate by least squares (fixed clamped >= 0);
    kv_bytes = tokens x kv_token_bytes, tokens = batch x context (decode) or batch (store)."""
    x = np.array([p["batch"] * (p["context"] or 1) * kv_token_bytes for p in points], dtype=float)
    y = np.array([p["median_s"] for p in points], dtype=float)
    if len(points) >= 2 and np.ptp(x) > 0:
        slope, fixed = np.polyfit(x, y, 1)
        if fixed >= 0 and slope > 0:
            return float(fixed), float(1.0 / slope)
    slope = float((x * y).sum() / (x * x).sum())  # through the origin
    return 0.0, 1.0 / slope


def fit(measurements: list[dict], kv_token_bytes: int) -> dict:
    """The `fit` section from raw measurements; kv_token_bytes = K+V bytes of one token on one layer."""
    contiguous = [m for m in measurements if m["kernel"] == "contiguous_decode"]
    base = {(m["batch"], m["context"]): m["median_s"] for m in contiguous}
    overhead = {}
    for bs in BLOCK_SIZES:
        ratios = [m["median_s"] / base[(m["batch"], m["context"])] for m in measurements
                  if m["kernel"] == "paged_decode" and m["block_size"] == bs and m["table"] == "permuted"]
        overhead[str(bs)] = float(math.exp(np.mean(np.log(ratios))))
    attn_fixed, attn_bw = _linear_fit(contiguous, kv_token_bytes)
    store_fixed, store_bw = _linear_fit([m for m in measurements if m["kernel"] == "store_kv"],
                                           kv_token_bytes)
    return {"decode_attn_fixed_s": attn_fixed, "decode_attn_bytes_per_s": attn_bw,
            "paged_overhead": overhead, "store_kv_fixed_s": store_fixed, "store_kv_bytes_per_s": store_bw}


def calibrate(backend: Backend, gpu_preset: str | None, quick: bool = False, seed: int = 0) -> dict:
    """Run the grid on `backend` and return the calibration document (a JSON-ready dict).

    gpu_preset names the kvsim GPU whose datasheet HBM bandwidth is reported (None: unknown, null).
    The interpreter always uses the tiny CPU grid and marks the file unusable for prediction.
    """
    import triton
    g = CPU_GRID if backend.interpret else (GPU_QUICK if quick else GPU_GRID)
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    measurements = []
    for batch in g.batches:
        for context in g.contexts:
            if batch * context <= g.max_tokens:
                measurements += _decode_point(g, batch, context, backend, gen)
    measurements += [_store_point(g, n, backend, gen) for n in g.store_tokens]
    return {
        "format": FORMAT,
        "created": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": backend.name,
        "backend": backend.kind,
        "usable_for_prediction": not backend.interpret,
        "versions": {"torch": torch.__version__.split("+")[0], "triton": triton.__version__,
                     "python": platform.python_version()},
        "shape": {"num_q_heads": g.q_heads, "num_kv_heads": g.kv_heads, "head_dim": g.head_dim,
                  "dtype": str(g.dtype).removeprefix("torch.")},
        "hbm": {"datasheet_bytes_per_s": bench.datasheet_bytes_per_s(gpu_preset),
                "copy_bytes_per_s": bench.copy_bytes_per_s(backend.device, not backend.interpret, g.copy_bytes)},
        "fit": fit(measurements, 2 * g.kv_heads * g.head_dim * g.dtype.itemsize),
        "measurements": measurements,
    }
