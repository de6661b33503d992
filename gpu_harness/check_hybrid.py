"""Correctness grid of the hybrid-model kernels (issue 23): sliding-window and chunked-local paged decode
over tables with null entries, and MLA decode over the latent cache, each against its torch reference
(same rows and tolerances as `gpu_harness.check`).

Null entries come in two kinds: -1 (`layout.PAD`; out of bounds if read) and vLLM's null block, id 0,
here filled with NaN (a read turns the output into NaN, even one masked after the load, since a NaN
value times a zero weight is NaN). `full=True` uses real shapes: gpt-oss (W=128, 64/8 heads, d64),
Gemma 3 27B (W=1024, 32/16 heads, d128), Llama 4 Scout (chunks of 8192, 40/8 heads, d128),
DeepSeek-V3 MLA (rank 512 + rope 64, 128 heads, and 16 heads as on each of 8 tensor-parallel ranks),
plus tables past 2**31 cache elements.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import torch

from gpu_harness import layout, reference
from gpu_harness.backend import get_backend
from gpu_harness.check import DTYPE_NAMES, OVERFLOW_BLOCKS, TOLERANCE, CheckRow, DecodeCase, compare, decode_inputs

NULL_KINDS = ("pad", "null0")
#: DeepSeek-V3's softmax scale (config.json: qk_nope_head_dim 128, qk_rope_head_dim 64, yarn factor 40,
#: mscale_all_dim 1.0): (128 + 64) ** -0.5 * mscale**2 with mscale = 0.1 * ln(40) + 1 (vLLM
#: deepseek_v2.py, DeepseekV2MLAAttention.__init__ with yarn_get_mscale), about 0.1353.
DEEPSEEK_V3_SCALE = (128 + 64) ** -0.5 * (0.1 * math.log(40) + 1.0) ** 2
#: Blocks of 16 tokens x 576 values such that block offsets exceed 2**31 elements (4.4 GB bf16).
MLA_OVERFLOW_BLOCKS = 240_000


@dataclass(frozen=True, slots=True)
class WindowCase:
    """A sliding-window decode (or, `chunked`, a chunked-local one with chunks of `window` tokens): the
    launch of `decode`, window W tokens, and the kind of null entry."""

    decode: DecodeCase
    window: int
    null: str = "pad"  # "pad": -1; "null0": vLLM's null block id 0, filled with NaN
    chunked: bool = False

    @property
    def name(self) -> str:
        span = f"chunk C{self.window}" if self.chunked else f"window W{self.window}"
        return f"{span} null={self.null} {self.decode.name}"

    def spans(self) -> dict:
        """The launcher's keyword: {"window": W} or {"chunk": C}."""
        return {"chunk" if self.chunked else "window": self.window}


def window_inputs(c: WindowCase, device: str, gen: torch.Generator):
    """(q, k_cache, v_cache, block_table, seq_lens) with the entries of blocks wholly before each window
    nulled; under "null0" every real block id is shifted by one behind a NaN block 0."""
    if c.null not in NULL_KINDS:
        raise ValueError(f"null must be one of {NULL_KINDS}, got {c.null!r}")
    q, kc, vc, bt, sl, tables = decode_inputs(c.decode, device, gen)
    null = layout.PAD
    if c.null == "null0":
        nan = torch.full((1, *kc.shape[1:]), float("nan"), dtype=kc.dtype, device=device)
        kc, vc = torch.cat([nan, kc]), torch.cat([nan, vc])
        tables = [[b + 1 for b in ids] for ids in tables]
        null = 0
    tables = layout.null_out_of_window(tables, c.decode.seq_lens, c.decode.block_size, c.window, null, c.chunked)
    if null == layout.PAD:
        layout.check_window_tables(tables, c.decode.seq_lens, c.decode.block_size, c.window, c.chunked)
    return q, kc, vc, layout.make_block_table(tables, device, bt.shape[1]), sl


def check_window(c: WindowCase, device: str, gen: torch.Generator) -> CheckRow:
    """Windowed (or chunked) paged decode over nulled tables against the reference."""
    from gpu_harness.kernels import paged_decode
    q, kc, vc, bt, sl = window_inputs(c, device, gen)
    out = paged_decode(q, kc, vc, bt, sl, num_splits=c.decode.splits, **c.spans())
    ref = reference.ref_paged_decode(q, kc, vc, bt, sl, **c.spans())
    return compare(f"paged {c.name}", out, ref, *TOLERANCE[c.decode.dtype])


@dataclass(frozen=True, slots=True)
class MlaCase:
    """An MLA decode: query heads, latent rank + rope width, page size, contexts, splits, table order."""

    dtype: torch.dtype
    q_heads: int
    rank: int
    rope: int
    block_size: int
    seq_lens: tuple[int, ...]
    splits: int
    table: str = "permuted"  # as DecodeCase.table
    num_blocks: int | None = None
    scale: float | None = None  # None: (rank + rope) ** -0.5

    @property
    def name(self) -> str:
        lens = ",".join(map(str, self.seq_lens))
        return (f"mla {DTYPE_NAMES[self.dtype]} h{self.q_heads} r{self.rank}+{self.rope} "
                f"bs{self.block_size} L[{lens}] s{self.splits} {self.table}")


def mla_inputs(c: MlaCase, device: str, gen: torch.Generator):
    """(q [B, Hq, R_L + R_P], kv_cache [num_blocks, bs, R_L + R_P], block_table, seq_lens, scale):
    the latent cache is a paged cache with one KV head of R_L + R_P values per token."""
    as_decode = DecodeCase(c.dtype, c.q_heads, 1, c.rank + c.rope, c.block_size, c.seq_lens, c.splits,
                           c.table, c.num_blocks)
    q, kc, _, bt, sl, _ = decode_inputs(as_decode, device, gen)
    scale = (c.rank + c.rope) ** -0.5 if c.scale is None else c.scale
    return q, kc[:, :, 0], bt, sl, scale


def check_mla(c: MlaCase, device: str, gen: torch.Generator) -> CheckRow:
    """MLA decode against the reference (absorbed query, latent values)."""
    from gpu_harness.kernels import mla_decode
    q, kv, bt, sl, scale = mla_inputs(c, device, gen)
    out = mla_decode(q, kv, bt, sl, kv_lora_rank=c.rank, scale=scale, num_splits=c.splits)
    ref = reference.ref_mla_decode(q, kv, bt, sl, c.rank, scale)
    return compare(c.name, out, ref, *TOLERANCE[c.dtype])


def _small_grid(device: str, gen: torch.Generator) -> list[CheckRow]:
    bf16, fp32 = torch.bfloat16, torch.float32
    return [
        # W=8, bs 8: windows start mid-block (L 9, 17, 40), on a boundary (L 8, 16) and before 0 (L 1, 7)
        check_window(WindowCase(DecodeCase(bf16, 8, 2, 64, 8, (1, 7, 8, 9, 17, 40), 1), 8, "pad"), device, gen),
        check_window(WindowCase(DecodeCase(fp32, 4, 1, 64, 16, (5, 16, 33, 47), 2), 20, "null0"), device, gen),
        # chunks of 8: L 8 and 16 end a chunk, L 9 and 17 start one (a single token), L 30 is mid-chunk
        check_window(WindowCase(DecodeCase(bf16, 8, 2, 64, 4, (1, 8, 9, 16, 17, 30), 1), 8, "null0", True),
                     device, gen),
        check_mla(MlaCase(bf16, 16, 32, 16, 16, (1, 15, 16, 17), 1), device, gen),
        check_mla(MlaCase(fp32, 20, 32, 16, 8, (3, 40), 2), device, gen),
    ]


def _full_grid(device: str, gen: torch.Generator) -> list[CheckRow]:
    bf16, fp16, fp32 = torch.bfloat16, torch.float16, torch.float32
    # window starts L - W: before 0, 0, 1 (mid-block), a block boundary (160 - 128 = 32; 1536 - 1024 = 512)
    oss_lens = (1, 15, 16, 17, 127, 128, 129, 160, 1025, 4097)
    gemma_lens = (1, 17, 1023, 1024, 1025, 1536, 4097, 8193)
    rows = [check_window(WindowCase(DecodeCase(bf16, 64, 8, 64, bs, oss_lens, s), 128, null), device, gen)
            for bs, s, null in itertools.product((1, 16, 32), (1, 8), NULL_KINDS)]
    rows += [check_window(WindowCase(DecodeCase(bf16, 32, 16, 128, bs, gemma_lens, s), 1024, null), device, gen)
             for bs, s, null in itertools.product((16, 32), (1, 8), NULL_KINDS)]
    rows += [check_window(WindowCase(DecodeCase(dt, 32, 16, 128, 16, gemma_lens, s), 1024), device, gen)
             for dt, s in ((fp32, 1), (fp16, 8))]
    rows += [check_window(WindowCase(DecodeCase(bf16, 32, 8, 128, 16, (1, 17, 1025, 4097), s, "high",
                                                OVERFLOW_BLOCKS), 1024), device, gen) for s in (1, 8)]
    # Llama 4 Scout's chunked local layers: chunk starts 0, 8192, 16384 (always on a block boundary)
    scout_lens = (1, 17, 8191, 8192, 8193, 12288, 16385)
    rows += [check_window(WindowCase(DecodeCase(bf16, 40, 8, 128, bs, scout_lens, s), 8192, null, True), device, gen)
             for bs, s, null in itertools.product((16, 32), (1, 8), NULL_KINDS)]
    mla_lens = (1, 15, 16, 17, 1025, 4097)
    rows += [check_mla(MlaCase(bf16, h, 512, 64, bs, mla_lens, s, scale=DEEPSEEK_V3_SCALE), device, gen)
             for h, bs, s in itertools.product((128, 16), (16, 64), (1, 8))]
    rows += [check_mla(MlaCase(dt, 128, 512, 64, 64, mla_lens, s, scale=DEEPSEEK_V3_SCALE), device, gen)
             for dt, s in ((fp32, 1), (fp16, 8))]
    rows += [check_mla(MlaCase(bf16, 128, 512, 64, 16, (1, 17, 1025), s, "high", MLA_OVERFLOW_BLOCKS,
                               DEEPSEEK_V3_SCALE), device, gen) for s in (1, 8)]
    return rows


def run_hybrid_check(full: bool = False, seed: int = 0) -> list[CheckRow]:
    """Run the small (CPU-friendly) or the full (GPU, real shapes) hybrid grid on the selected backend."""
    backend = get_backend()
    gen = torch.Generator().manual_seed(seed)
    return (_full_grid if full else _small_grid)(backend.device, gen)
