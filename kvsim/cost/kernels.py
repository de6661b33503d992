"""Paged decode-attention kernel families: the block sizes each kernel accepts and its cost against a
contiguous kernel per block size. An engine profile names its family (`EngineProfile.kernel`); the cost
model and the block-size tuner read the same curve from here, so every run of a profile pays one cost. A
calibration file (`--calibration`, from `kvsim harness calibrate` on a GPU) replaces the curve by the
factor measured on that GPU. Sources: docs/engine-profiles.md ("Paged kernels").

Units: block sizes in tokens; the factor is paged / contiguous decode-attention time (dimensionless).
"""

from __future__ import annotations

from dataclasses import dataclass


#: The tuner's default grid stops here (tokens): the vLLM paper's study stops at 256 too, and larger pages
#: waste most of a short request's memory; the tuner says so when its best size is at the edge.
TUNER_MAX_BLOCK = 256


@dataclass(frozen=True, slots=True)
class KernelFamily:
    """One paged-attention kernel: factor(b) = floor + per_block / b for the block sizes it accepts.

    block_sizes: the sizes the kernel runs (a tuple of sizes), or `multiple_of` > 0 (any multiple of
    it, up to `max_block`); basis: "published" or "assumed" for the curve."""

    name: str
    floor: float
    per_block: float
    block_sizes: tuple[int, ...] = ()
    multiple_of: int = 0
    max_block: int = 0
    basis: str = "assumed"
    source: str = ""

    def __post_init__(self) -> None:
        if self.floor < 1 or self.per_block < 0:
            raise ValueError(f"kernel {self.name!r}: floor must be >= 1 and per_block >= 0")

    def factor(self, block_size: int) -> float:
        """Paged / contiguous decode-attention time at `block_size` tokens."""
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        return self.floor + self.per_block / block_size

    def accepts(self, block_size: int) -> bool:
        """Whether the kernel runs at `block_size` tokens."""
        if self.multiple_of:
            return block_size % self.multiple_of == 0 and 0 < block_size <= self.max_block
        return block_size in self.block_sizes

    def candidates(self) -> tuple[int, ...]:
        """The block sizes the kernel runs, as a tuner grid (multiples: powers of two times the base, up
        to TUNER_MAX_BLOCK)."""
        if not self.multiple_of:
            return self.block_sizes
        out, b = [], self.multiple_of
        while b <= min(self.max_block, TUNER_MAX_BLOCK):
            out.append(b)
            b *= 2
        return tuple(out)

    def accepted_text(self) -> str:
        if self.multiple_of:
            return f"multiples of {self.multiple_of} up to {self.max_block}"
        return ", ".join(map(str, self.block_sizes))


KERNELS: dict[str, KernelFamily] = {k.name: k for k in (
    # vLLM v0.1-v0.2 PagedAttention (CUDA, 2023): `--block-size` choices [8, 16, 32] (vllm/engine/arg_utils.py
    # of v0.1.x; the kernel is compiled for those three). Level: 20-26 % slower than FasterTransformer's
    # contiguous kernel at block 16 (Kwon et al., SOSP'23, Sec. 7.1 / Fig. 18a: a kernel microbenchmark),
    # taken as 1.23 at 16. Slope: ASSUMED (one block-table read and one new gather per block, 1/b); it
    # moves the factor only from 1.295 (b = 8) to 1.20 (b = 32) over the sizes the kernel accepts.
    KernelFamily("vllm-v0-paged", floor=1.17, per_block=1.0, block_sizes=(8, 16, 32), basis="published level, assumed slope",
                 source="vLLM paper Sec. 7.1 (20-26 % over FasterTransformer at block 16); 1/b slope assumed"),
    # FlashAttention (vLLM V1's default backend, also Triton): get_supported_kernel_block_sizes returns
    # MultipleOf(16) (vllm/v1/attention/backends/flash_attn.py, triton_attn.py, vLLM 0.33). Cost: Vidur's
    # decode-attention anchors (paged kernel, block 16, Llama-2-7B on A100; /work/shared/calibration) read KV
    # at 0.96 of HBM bandwidth, so no penalty over contiguous at >= 16 (factor 1).
    KernelFamily("flash-attn", floor=1.0, per_block=0.0, multiple_of=16, max_block=1024, basis="published",
                 source="Vidur A100 decode anchors (paged, block 16) at 0.96 of HBM bandwidth"),
    # FlashInfer (vLLM 0.33 backend): [16, 32, 64] (128-1024 only on Blackwell trtllm-gen kernels;
    # vllm/v1/attention/backends/flashinfer.py). Cost: as flash-attn (no separate microbenchmark here).
    KernelFamily("flashinfer", floor=1.0, per_block=0.0, block_sizes=(16, 32, 64), basis="assumed",
                 source="as flash-attn (assumed); block sizes from vLLM 0.33 flashinfer.py"),
)}


def get_kernel(name: str) -> KernelFamily:
    """A kernel family by name (ValueError naming the known ones)."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel family {name!r}; known: {', '.join(KERNELS)}") from None
