"""The invariants of a `kvsim.trace.table.Trace` beyond its main columns: samples' own lengths, prefix groups
and block hashes. Each check raises ValueError naming the field and the first request that breaks it.
"""

from __future__ import annotations

import numpy as np


def frozen(a: np.ndarray) -> np.ndarray:
    """`a`, made read-only."""
    a.flags.writeable = False
    return a


def first_bad(name: str, bad: np.ndarray, rule: str, offset: int = 0) -> None:
    """Raise ValueError naming the first request where `bad` holds."""
    hits = np.flatnonzero(bad)
    if len(hits):
        raise ValueError(f"Trace.{name} must be {rule}; request {int(hits[0]) + offset} is not")


def _csr(off, val, num: int, kind: str, dim: str) -> bool:
    """Check the CSR pair `{kind}_offsets` [num + 1] / `{kind}_values` [dim] and freeze it; False when
    both are absent (ValueError when only one is given or they do not fit together)."""
    if off is None or val is None:
        if off is not None or val is not None:
            raise ValueError(f"Trace.{kind}_offsets and Trace.{kind}_values go together")
        return False
    if off.dtype != np.int64 or off.shape != (num + 1,) or val.dtype != np.int64 or val.ndim != 1:
        raise ValueError(f"Trace.{kind}_offsets must be int64 [{num + 1}], {kind}_values int64 [{dim}]")
    if off[0] != 0 or off[-1] != len(val) or np.any(np.diff(off) < 0):
        raise ValueError(f"Trace.{kind}_offsets must start at 0, not decrease, and end at len({kind}_values)")
    frozen(off), frozen(val)
    return True


def check_samples(trace, num: int) -> None:
    """`output_tokens_per_sample`: absent, or n lengths per request whose largest is output_tokens."""
    off, val = trace.sample_offsets, trace.sample_values
    if not _csr(off, val, num, "sample", "S"):
        return
    count = np.diff(off)
    has = count > 0
    rule = "absent, or n lengths in [1, output_tokens] whose largest is output_tokens (beam_width 1)"
    first_bad("output_tokens_per_sample", has & ((count != trace.n) | (trace.beam_width != 1)), rule)
    owner = np.repeat(np.arange(num), count)
    bad = np.zeros(num, dtype=bool)
    bad[owner[(val < 1) | (val > trace.output_tokens[owner])]] = True
    if has.any():
        bad[has] |= np.maximum.reduceat(val, off[:-1][has]) != trace.output_tokens[has]
    first_bad("output_tokens_per_sample", bad, rule)


def check_groups(trace, num: int) -> None:
    """Prefix groups: valid indices, and prefix_tokens >= 1 exactly for requests in a group."""
    g = trace.prefix_group
    if g is None:
        first_bad("prefix_tokens", trace.prefix_tokens != 0, "0 without a prefix_group")
        return
    if g.dtype != np.int64 or g.shape != (num,):
        raise ValueError(f"Trace.prefix_group must be an int64 array of shape ({num},)")
    frozen(g)
    first_bad("prefix_group", (g < -1) | (g >= len(trace.prefix_group_names)),
               f"-1 or an index into {len(trace.prefix_group_names)} group names")
    first_bad("prefix_tokens", (g >= 0) != (trace.prefix_tokens > 0),
               ">= 1 exactly when the request has a prefix_group")


def check_hashes(trace, num: int) -> None:
    """Block hashes (CSR): well-formed offsets, a positive block size, none beside a prefix group."""
    off, val = trace.hash_offsets, trace.hash_values
    if not _csr(off, val, num, "hash", "H"):
        return
    if trace.hash_block_size is not None and trace.hash_block_size < 1:
        raise ValueError(f"Trace.hash_block_size must be >= 1, got {trace.hash_block_size}")
    if trace.prefix_group is not None:
        first_bad("block_hashes", (np.diff(off) > 0) & (trace.prefix_group >= 0),
                   "absent when the request has a prefix_group")
