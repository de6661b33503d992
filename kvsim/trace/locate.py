"""Where a trace's request came from, for messages that name the file, the line and the request id.

The readers skip blank lines (JSONL) and a header line (CSV), so request i is not always line i + 1; the
line is found by reading the file again, only when a message needs it (`where`). Also the first request
with more than one sequence (`first_multi_sequence`), which the hybrid and Jenga allocators refuse.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from kvsim.trace.table import Trace


def line_of(source: str, index: int) -> int | None:
    """The 1-based line of request `index` in file `source` (JSONL: its `index`-th non-blank line; a CSV:
    the one after the header), or None when the file cannot be read."""
    try:
        with Path(source).open(encoding="utf-8", errors="replace") as f:
            seen, header = -1, None
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                if header is None:
                    header = not line.lstrip().startswith("{")     # a CSV's first line names its columns
                    if header:
                        continue
                seen += 1
                if seen == index:
                    return lineno
    except OSError:
        return None
    return None


def where(trace: Trace, index: int) -> str:
    """'FILE line L, request ID' for request `index` (without FILE and line for a trace made in memory)."""
    rid = trace.request_id(index)
    line = line_of(trace.path, index) if trace.path else None
    place = f"{trace.path} line {line}, " if line is not None else (f"{trace.source}, " if trace.source else "")
    return f"{place}request {rid!r}"


def first_multi_sequence(trace: Trace) -> int | None:
    """The index of the first request with parallel samples (n > 1) or beams (beam_width > 1), or None."""
    many = np.flatnonzero((trace.n > 1) | (trace.beam_width > 1))
    return int(many[0]) if len(many) else None


def check_one_sequence(trace: Trace, allocator: str, mamba: bool) -> None:
    """ValueError naming the file, line and request id of the first request with more than one sequence,
    for an allocator that serves one sequence per request (`allocator`: 'hybrid' or 'jenga'), with the
    remedy (`mamba`: the model has Mamba layers, which vLLM cannot page as full attention)."""
    i = first_multi_sequence(trace)
    if i is None:
        return
    what = f"n = {int(trace.n[i])}" if trace.n[i] > 1 else f"beam_width = {int(trace.beam_width[i])}"
    if mamba:
        remedy = "a model with Mamba layers cannot be paged as full attention: give such requests n = 1"
    elif allocator == "jenga":
        remedy = "--allocator paged --no-hybrid-kv-cache serves such traces (every layer paged as full attention)"
    else:
        remedy = "--no-hybrid-kv-cache serves such traces (every layer paged as full attention)"
    raise ValueError(f"{where(trace, i)}: {what}, but the {allocator} allocator serves one sequence per request "
                     f"(no parallel samples or beams, as vLLM's hybrid KV cache manager); {remedy}")
