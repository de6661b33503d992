"""Timing and the bytes model shared by calibration (no kernels here).

Times are seconds; bytes follow KERNELS.md section 5 (what must cross HBM); bandwidths are bytes/s
(decimal GB/s = bytes_per_s / 1e9). On a GPU, `median_time_s` uses `triton.testing.do_bench` (CUDA
events, L2 cleared before each call, median); on the interpreter it takes wall-clock medians.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Callable

import torch

from kvsim.specs import get_gpu


def median_time_s(fn: Callable[[], object], on_gpu: bool, cpu_reps: int = 3) -> float:
    """Median seconds per call of fn: do_bench(return_mode="median") on GPU, wall clock on CPU."""
    if on_gpu:
        import triton.testing
        return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") / 1e3
    fn()  # warm-up (the interpreter has no compile step, but the first call builds caches)
    samples = []
    for _ in range(cpu_reps):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def decode_bytes(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int, elem_bytes: int,
                 block_size: int | None, splits: int) -> int:
    """HBM bytes of one decode launch: K and V read, Q in and O out, the block table (paged only),
    and the fp32 split partials written then read (split-KV only)."""
    kv = 2 * batch * context * kv_heads * head_dim * elem_bytes
    qo = 2 * batch * q_heads * head_dim * elem_bytes
    table = 4 * batch * math.ceil(context / block_size) if block_size else 0
    partials = 2 * batch * q_heads * splits * (head_dim + 1) * 4 if splits > 1 else 0
    return kv + qo + table + partials


def window_decode_bytes(batch: int, context: int, window: int, q_heads: int, kv_heads: int, head_dim: int,
                        elem_bytes: int, block_size: int, splits: int) -> int:
    """HBM bytes of a sliding-window decode launch: `decode_bytes` of the min(context, window) tokens it
    reads (the one extra table entry of a window starting mid-block, 4 bytes, is left out)."""
    return decode_bytes(batch, min(context, window), q_heads, kv_heads, head_dim, elem_bytes, block_size,
                        splits)


def mla_decode_bytes(batch: int, context: int, q_heads: int, rank: int, rope: int, elem_bytes: int,
                     block_size: int, splits: int) -> int:
    """HBM bytes of an MLA decode launch: each token's latent row (rank + rope values) read once (it is
    both key and value), q in (rank + rope per head), the latent output out (rank per head), the block
    table, and the fp32 split partials (rank + 1 per head and split) written then read."""
    rows = batch * context * (rank + rope) * elem_bytes
    qo = batch * q_heads * (2 * rank + rope) * elem_bytes
    table = 4 * batch * math.ceil(context / block_size)
    partials = 2 * batch * q_heads * splits * (rank + 1) * 4 if splits > 1 else 0
    return rows + qo + table + partials


def store_bytes(num_tokens: int, kv_heads: int, head_dim: int, elem_bytes: int) -> int:
    """HBM bytes of one store_kv launch: K and V rows read and written, plus the int64 slot mapping."""
    return 2 * 2 * num_tokens * kv_heads * head_dim * elem_bytes + 8 * num_tokens


def copy_bytes_per_s(device: str, on_gpu: bool, size_bytes: int) -> float:
    """Empirical peak: a large device-to-device `copy_` of size_bytes (counted as 2 x size: read + write)."""
    src = torch.empty(size_bytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size_bytes / median_time_s(lambda: dst.copy_(src), on_gpu)


#: Substrings of torch.cuda.get_device_name() -> kvsim GPU preset, most specific first.
_GPU_NAMES = (("H200", "h200"), ("H100", "h100-80gb"), ("A100-SXM4-80GB", "a100-80gb"),
              ("A100 80GB", "a100-80gb"), ("A100", "a100-40gb"), ("A10G", "a10g"), ("L4", "l4"))


def guess_gpu_preset(device_name: str) -> str | None:
    """The kvsim GPU preset for a CUDA device name, or None when it is not recognised."""
    for fragment, preset in _GPU_NAMES:
        if fragment.lower() in device_name.lower():
            return preset
    return None


def datasheet_bytes_per_s(preset: str | None) -> float | None:
    """HBM datasheet bandwidth of a kvsim GPU preset (ValueError for an unknown name), None without one."""
    return None if preset is None else get_gpu(preset).hbm_bytes_per_s
