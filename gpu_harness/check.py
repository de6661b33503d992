"""Kernel correctness grid: every kernel against its torch reference, plus metamorphic checks.

`run_check(full=False)` is a small grid that runs on the CPU interpreter in seconds; `full=True` is the
real-shape GPU grid of KERNELS.md section 7 (L in {1, 15, 16, 17, 1025, 4097}, page sizes {1, 16, 32},
heads {(8,8), (32,8), (5,1)}, D in {64, 128}, splits {1, 8}, and a cache whose block offsets overflow
int32). Tolerances: fp32 1e-4; fp16/bf16 vLLM's atol=1.5e-2, rtol=1e-2; exact for the copies.
The hybrid-model kernels (sliding-window and MLA decode) have their grid in `check_hybrid`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from gpu_harness import layout, reference
from gpu_harness.backend import get_backend

TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (1.5e-2, 1e-2), torch.bfloat16: (1.5e-2, 1e-2)}
DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}


@dataclass(frozen=True, slots=True)
class CheckRow:
    """One case: its worst absolute error against the reference and whether it is within tolerance."""

    case: str
    max_abs_err: float
    atol: float
    rtol: float
    passed: bool


@dataclass(frozen=True, slots=True)
class DecodeCase:
    """A decode launch: shapes, page size, context lengths of the batch, split factor, table order."""

    dtype: torch.dtype
    q_heads: int
    kv_heads: int
    head_dim: int
    block_size: int
    seq_lens: tuple[int, ...]
    splits: int
    table: str = "permuted"  # or "sequential", or "high" (ids at the top of a cache past 2**31 elements)
    num_blocks: int | None = None

    @property
    def name(self) -> str:
        lens = ",".join(map(str, self.seq_lens))
        return (f"{DTYPE_NAMES[self.dtype]} h{self.q_heads}/{self.kv_heads} d{self.head_dim} "
                f"bs{self.block_size} L[{lens}] s{self.splits} {self.table}")


def compare(case: str, out: torch.Tensor, ref: torch.Tensor, atol: float, rtol: float) -> CheckRow:
    """Worst |out - ref| and whether every element is within atol + rtol * |ref| (a NaN fails)."""
    diff = (out.float() - ref.float()).abs()
    worst = diff.max().item() if diff.numel() else 0.0
    ok = bool((diff <= atol + rtol * ref.float().abs()).all()) and not diff.isnan().any()
    return CheckRow(case, worst, atol, rtol, ok)


def decode_inputs(c: DecodeCase, device: str, gen: torch.Generator):
    """(q, k_cache, v_cache, block_table, seq_lens, tables) for a case; only used blocks are filled."""
    bs = c.block_size
    need = sum(layout.blocks_needed(n, bs) for n in c.seq_lens)
    num_blocks = c.num_blocks or need
    if c.table == "sequential":
        tables = layout.sequential_tables(c.seq_lens, bs)
    elif c.table == "high":
        tables = [[t + num_blocks - need for t in ids] for ids in layout.sequential_tables(c.seq_lens, bs)]
    else:
        tables = layout.permuted_tables(c.seq_lens, bs, gen, num_blocks)
    k_cache, v_cache = layout.alloc_paged_cache(num_blocks, bs, c.kv_heads, c.head_dim, c.dtype, device,
                                                fill="zeros" if num_blocks == need else "empty")
    ids = torch.tensor([i for t in tables for i in t], dtype=torch.long, device=device)
    shape = (len(ids), bs, c.kv_heads, c.head_dim)
    k_cache[ids] = torch.randn(shape, generator=gen).to(device, c.dtype)
    v_cache[ids] = torch.randn(shape, generator=gen).to(device, c.dtype)
    q = torch.randn((len(c.seq_lens), c.q_heads, c.head_dim), generator=gen).to(device, c.dtype)
    return (q, k_cache, v_cache, layout.make_block_table(tables, device),
            layout.make_seq_lens(c.seq_lens, device), tables)


def check_paged(c: DecodeCase, device: str, gen: torch.Generator) -> CheckRow:
    from gpu_harness.kernels import paged_decode
    q, kc, vc, bt, sl, _ = decode_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, num_splits=c.splits)
    return compare(f"paged {c.name}", out, reference.ref_paged_decode(q, kc, vc, bt, sl), *TOLERANCE[c.dtype])


def check_contiguous(c: DecodeCase, device: str, gen: torch.Generator) -> CheckRow:
    from gpu_harness.kernels import contiguous_decode
    s_max = max(c.seq_lens)
    shape = (len(c.seq_lens), s_max, c.kv_heads, c.head_dim)
    k = torch.randn(shape, generator=gen).to(device, c.dtype)
    v = torch.randn(shape, generator=gen).to(device, c.dtype)
    q = torch.randn((len(c.seq_lens), c.q_heads, c.head_dim), generator=gen).to(device, c.dtype)
    sl = layout.make_seq_lens(c.seq_lens, device)
    out = contiguous_decode(q, k, v, sl, num_splits=c.splits)
    name = f"contiguous {DTYPE_NAMES[c.dtype]} h{c.q_heads}/{c.kv_heads} d{c.head_dim} L{list(c.seq_lens)} s{c.splits}"
    return compare(name, out, reference.ref_contiguous_decode(q, k, v, sl), *TOLERANCE[c.dtype])


def check_same_output(c: DecodeCase, other: DecodeCase, device: str, gen: torch.Generator) -> CheckRow:
    """Metamorphic: the same logical K/V under two layouts (page size, table order, splits) agree."""
    from gpu_harness.kernels import paged_decode
    q, kc, vc, bt, sl, tables = decode_inputs(c, device, gen)
    _, kc2, vc2, bt2, sl2, tables2 = decode_inputs(other, device, gen)
    layout.scatter_to_paged(layout.gather_contiguous(kc, c.seq_lens, tables), other.seq_lens, tables2, kc2)
    layout.scatter_to_paged(layout.gather_contiguous(vc, c.seq_lens, tables), other.seq_lens, tables2, vc2)
    a = paged_decode(q, kc, vc, bt, sl, num_splits=c.splits)
    b = paged_decode(q, kc2, vc2, bt2, sl2, num_splits=other.splits)
    return compare(f"same: {c.name} == {other.name}", a, b, *TOLERANCE[c.dtype])


def check_store_kv(dtype: torch.dtype, num_tokens: int, kv_heads: int, head_dim: int, block_size: int,
                   num_blocks: int, device: str, gen: torch.Generator, high: bool = False) -> CheckRow:
    """Unique random slots (every 4th token padding, slot -1) into a zeroed cache; exact comparison of
    the written rows, and no other element changed (the non-zero count equals the written values')."""
    from gpu_harness.kernels import store_kv
    kc, vc = layout.alloc_paged_cache(num_blocks, block_size, kv_heads, head_dim, dtype, device, fill="zeros")
    total = num_blocks * block_size
    pool = range(total - 4 * num_tokens, total) if high else range(total)
    slots = torch.tensor(pool)[torch.randperm(len(pool), generator=gen)[:num_tokens]]
    slots[::4] = -1
    key = torch.randn((num_tokens, kv_heads, head_dim), generator=gen).to(device, dtype)
    value = torch.randn((num_tokens, kv_heads, head_dim), generator=gen).to(device, dtype)
    slots = slots.to(device)
    store_kv(key, value, kc, vc, slots)
    valid = slots >= 0
    worst = 0.0
    ok = True
    for new, cache in ((key, kc), (value, vc)):
        rows = cache.view(-1, kv_heads, head_dim)[slots[valid]]
        worst = max(worst, (rows.float() - new[valid].float()).abs().max().item())
        ok &= torch.equal(rows, new[valid]) and cache.count_nonzero().item() == new[valid].count_nonzero().item()
    name = f"store_kv {DTYPE_NAMES[dtype]} T{num_tokens} h{kv_heads} d{head_dim} bs{block_size}" + (" high" if high else "")
    return CheckRow(name, worst, 0.0, 0.0, ok)


def check_copy_blocks(dtype: torch.dtype, num_blocks: int, num_pairs: int, device: str,
                      gen: torch.Generator) -> CheckRow:
    """Copy-on-write pairs (distinct sources and destinations) against the Python-loop reference, exact."""
    from gpu_harness.kernels import copy_blocks
    kc, vc = layout.alloc_paged_cache(num_blocks, 16, 2, 64, dtype, device, fill="randn")
    perm = torch.randperm(num_blocks, generator=gen)[: 2 * num_pairs]
    mapping = perm.view(2, num_pairs).t().contiguous().to(device)  # [num_pairs, 2] (src, dst)
    k_ref, v_ref = kc.clone(), vc.clone()
    reference.ref_copy_blocks(k_ref, v_ref, mapping)
    copy_blocks(kc, vc, mapping)
    worst = max((kc.float() - k_ref.float()).abs().max().item(), (vc.float() - v_ref.float()).abs().max().item())
    ok = torch.equal(kc, k_ref) and torch.equal(vc, v_ref)
    return CheckRow(f"copy_blocks {DTYPE_NAMES[dtype]} {num_pairs} of {num_blocks} blocks", worst, 0.0, 0.0, ok)


def _small_grid(device: str, gen: torch.Generator) -> list[CheckRow]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    seq = DecodeCase(bf16, 8, 2, 64, 16, (17, 40), 1, "sequential")
    return [
        check_paged(DecodeCase(fp32, 8, 2, 80, 16, (1, 15, 16, 17), 1), device, gen),
        check_paged(DecodeCase(bf16, 8, 1, 64, 8, (1, 7, 8, 9), 2), device, gen),
        check_paged(DecodeCase(fp16, 4, 4, 128, 32, (1, 31, 32, 33), 1), device, gen),
        check_contiguous(DecodeCase(bf16, 8, 2, 80, 0, (1, 17, 33), 1), device, gen),
        check_contiguous(DecodeCase(fp32, 4, 4, 64, 0, (5, 40), 2), device, gen),
        check_same_output(seq, DecodeCase(bf16, 8, 2, 64, 16, (17, 40), 1), device, gen),
        check_same_output(DecodeCase(bf16, 8, 2, 64, 8, (17, 40), 1), DecodeCase(bf16, 8, 2, 64, 32, (17, 40), 1), device, gen),
        check_same_output(seq, DecodeCase(bf16, 8, 2, 64, 16, (17, 40), 3, "sequential"), device, gen),
        check_store_kv(fp16, 24, 2, 64, 8, 8, device, gen),
        check_store_kv(bf16, 16, 4, 80, 16, 4, device, gen),
        check_copy_blocks(bf16, 16, 5, device, gen),
    ]


#: KV-cache blocks of 16 x 8 x 128 elements such that block offsets exceed 2**31 elements (4.6 GB bf16).
OVERFLOW_BLOCKS = 140_000


def _full_grid(device: str, gen: torch.Generator) -> list[CheckRow]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    lens = (1, 15, 16, 17, 1025, 4097)
    heads = ((8, 8), (32, 8), (5, 1))
    rows = [check_paged(DecodeCase(bf16, hq, hk, d, bs, lens, s), device, gen)
            for bs, (hq, hk), d, s in itertools.product((1, 16, 32), heads, (64, 128), (1, 8))]
    rows += [check_contiguous(DecodeCase(bf16, hq, hk, d, 0, lens, s), device, gen)
             for (hq, hk), d, s in itertools.product(heads, (64, 128), (1, 8))]
    rows += [check_paged(DecodeCase(dt, 32, 8, d, 16, lens, s), device, gen)
             for dt, d, s in ((fp32, 128, 1), (fp32, 80, 8), (fp16, 80, 1), (fp16, 128, 8))]
    rows += [check_paged(DecodeCase(bf16, 32, 8, 128, 16, (1, 17, 1025), s, "high", OVERFLOW_BLOCKS), device, gen)
             for s in (1, 8)]
    seq = DecodeCase(bf16, 32, 8, 128, 16, (1025, 4097), 1, "sequential")
    rows += [check_same_output(seq, DecodeCase(bf16, 32, 8, 128, 16, (1025, 4097), 1), device, gen),
             check_same_output(seq, DecodeCase(bf16, 32, 8, 128, 1, (1025, 4097), 1), device, gen),
             check_same_output(seq, DecodeCase(bf16, 32, 8, 128, 16, (1025, 4097), 8, "sequential"), device, gen)]
    rows += [check_store_kv(bf16, 2048, 8, 128, 16, 1024, device, gen),
             check_store_kv(fp16, 4096, 8, 80, 32, 512, device, gen),
             check_store_kv(bf16, 1024, 8, 128, 16, OVERFLOW_BLOCKS, device, gen, high=True),
             check_copy_blocks(bf16, 4096, 512, device, gen)]
    return rows


def run_check(full: bool = False, seed: int = 0) -> list[CheckRow]:
    """Run the small (CPU-friendly) or the full (GPU, real shapes) grid on the selected backend."""
    backend = get_backend()
    gen = torch.Generator().manual_seed(seed)
    return (_full_grid if full else _small_grid)(backend.device, gen)
