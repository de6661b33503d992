"""The bookkeeping cost of paged KV per engine step, which grows as blocks get smaller.

Every step a paged engine builds the block table of each running sequence (one entry per block it
holds), copies the padded tables to the GPU, and allocates and frees blocks as sequences cross block
boundaries and finish. None of it is in the kernel cost model; the block-size tuner adds it per step.
Times are seconds; the JSON file (`kvsim-bookkeeping/1`) holds the four constants below, measured on the
machine at hand by `measure()` (kvsim's own allocator and a NumPy table build) or written by hand.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

FORMAT = "kvsim-bookkeeping/1"

#: CPU time to put one block id into a padded per-step block table: vLLM 2023 builds the tables as
#: Python lists and converts them with torch.tensor (tens of ns per element on a server CPU).
BLOCK_TABLE_ENTRY_S = 5e-8
#: CPU time to allocate or free one block in a Python block manager (free-list pop/push, a reference
#: count, the sequence's table append): about a microsecond in vLLM 2023's BlockSpaceManager.
BLOCK_ALLOC_FREE_S = 1e-6
#: One host-to-device copy of the step's block tables: launch and synchronisation, seconds.
TABLE_COPY_FIXED_S = 1e-5
#: Bytes per block-table entry (int32) copied to the GPU.
ENTRY_BYTES = 4


@dataclass(frozen=True, slots=True)
class Bookkeeping:
    """Per-step bookkeeping cost: `entry_s` per block-table entry, `alloc_free_s` per block allocated or
    freed, `copy_fixed_s` per step plus entries x ENTRY_BYTES / `copy_bytes_per_s` for the copy."""

    entry_s: float = BLOCK_TABLE_ENTRY_S
    alloc_free_s: float = BLOCK_ALLOC_FREE_S
    copy_fixed_s: float = TABLE_COPY_FIXED_S
    copy_bytes_per_s: float = 2.5e10       # PCIe 4.0 x16 host-to-device, bytes/s
    source: str = "stored defaults, not measured here (kvsim/planning/bookkeeping.py)"

    def __post_init__(self) -> None:
        for name in ("entry_s", "alloc_free_s", "copy_fixed_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"bookkeeping {name} must be a finite number >= 0 s, got {v!r}")
        if not (isinstance(self.copy_bytes_per_s, (int, float)) and self.copy_bytes_per_s > 0):
            raise ValueError(f"bookkeeping copy_bytes_per_s must be > 0, got {self.copy_bytes_per_s!r}")

    def step_s(self, entries: float, allocs_frees: float, copy_entries: float | None = None) -> float:
        """Seconds of one step building `entries` block-table entries, copying `copy_entries` (default:
        the same) to the GPU and allocating or freeing `allocs_frees` blocks.

        >>> import kvsim
        >>> bk = kvsim.Bookkeeping(entry_s=1e-7, alloc_free_s=1e-6, copy_fixed_s=0, copy_bytes_per_s=4e9)
        >>> round(bk.step_s(1000, 10) * 1e6, 3)     # microseconds: 1000 x (0.1 + 0.001) + 10 x 1
        111.0
        """
        copied = entries if copy_entries is None else copy_entries
        return (entries * self.entry_s + copied * ENTRY_BYTES / self.copy_bytes_per_s + self.copy_fixed_s
                + allocs_frees * self.alloc_free_s)

    def to_json(self) -> str:
        return json.dumps({"format": FORMAT, **asdict(self)}, indent=2)


def load(path: str | Path) -> Bookkeeping:
    """Read a `kvsim-bookkeeping/1` JSON file; errors name the file and field (ValueError)."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: line {exc.lineno}: not JSON ({exc.msg})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise ValueError(f"{path}: field 'format' must be {FORMAT!r}")
    fields = {}
    for name in ("entry_s", "alloc_free_s", "copy_fixed_s", "copy_bytes_per_s"):
        v = raw.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{path}: field {name!r} must be a number, got {v!r}")
        fields[name] = float(v)
    try:
        return Bookkeeping(**fields, source=str(raw.get("source", path)))
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def measure(num_seqs: int = 64, blocks_per_seq: int = 64, repeats: int = 5) -> Bookkeeping:
    """Time the CPU side on this machine: allocating and freeing blocks with kvsim's paged allocator, and
    building a padded int32 block table from Python lists (what an engine does before the copy). The
    copy constants stay at their defaults (timing a host-to-device copy needs the GPU harness).

    >>> import kvsim
    >>> kvsim.measure_bookkeeping(num_seqs=4, blocks_per_seq=8, repeats=1).entry_s > 0
    True
    """
    from kvsim.alloc.paged.allocator import PagedAllocator

    best_alloc, best_entry = math.inf, math.inf
    for _ in range(repeats):
        alloc = PagedAllocator(num_seqs * blocks_per_seq, 1)
        t0 = time.perf_counter()
        for s in range(num_seqs):
            alloc.allocate(s, 1, blocks_per_seq)
            alloc.append(s, blocks_per_seq - 1)
        for s in range(num_seqs):
            alloc.free(s)
        best_alloc = min(best_alloc, (time.perf_counter() - t0) / (2 * num_seqs * blocks_per_seq))
        tables = [alloc_table for alloc_table in ([list(range(blocks_per_seq))] * num_seqs)]
        t0 = time.perf_counter()
        width = max(len(t) for t in tables)
        padded = [t + [-1] * (width - len(t)) for t in tables]
        np.array(padded, dtype=np.int32)
        best_entry = min(best_entry, (time.perf_counter() - t0) / (num_seqs * blocks_per_seq))
    return Bookkeeping(entry_s=best_entry, alloc_free_s=best_alloc,
                       source=f"measured on this CPU by kvsim.planning.bookkeeping.measure "
                              f"({num_seqs} x {blocks_per_seq} blocks)")
