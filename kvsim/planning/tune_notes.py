"""The block-size tuner's verdict on the sizes near its best: the good range, and "no difference here,
keep the default" when the default block size is within the tolerance of the best (issue 41: a
recommendation of 256 with every size from 16 to 256 within 2 % reads as "change it", when the
difference is below what the cost model can tell apart: `docs/cost-model.md`, "Gap to the real
profiles", finds its predicted layer times at 0.85-1.15 of measured ones in the median, points at
0.55-1.5x)."""

from __future__ import annotations

import pandas as pd

#: vLLM's default block size (`--block-size`, `vllm/config/cache.py`), kvsim's too.
DEFAULT_BLOCK = 16


def default_gap(curve: pd.DataFrame, recommended: int, tolerance: float) -> float | None:
    """How far (a fraction) the default block size's capacity falls below the recommended one's, when
    that is within `tolerance` (no difference worth a change); None otherwise (`curve`: indexed by block
    size, with `capacity_tokens_per_s`)."""
    if recommended == DEFAULT_BLOCK or DEFAULT_BLOCK not in curve.index:
        return None
    gap = 1 - curve.capacity_tokens_per_s[DEFAULT_BLOCK] / curve.capacity_tokens_per_s.max()
    return float(gap) if gap <= tolerance else None


def within_note(curve: pd.DataFrame, recommended: int, good_range: tuple[int, int], tolerance: float) -> str:
    """The sentence on the sizes within `tolerance` of the best (`curve`: indexed by block size, with
    `capacity_tokens_per_s`)."""
    lo, hi = good_range
    if lo == hi:
        return f"No other block size comes within {100 * tolerance:.0f}% of it."
    text = f"Block sizes {lo} to {hi} are within {100 * tolerance:.0f}% of the best."
    gap = default_gap(curve, recommended, tolerance)
    if gap is not None:
        text += (f" No difference here worth a change: the default, {DEFAULT_BLOCK}, is {100 * gap:.1f}% "
                 f"below the best, less than this model can tell apart; keep the default.")
    return text


def headline(curve: pd.DataFrame, recommended: int, good_range: tuple[int, int], tolerance: float) -> str:
    """The tuner's answer in a line: the recommended size, or "keep the default" when the default is
    within `tolerance` of it (`default_gap`; `curve` indexed by block size or with a `block_size`
    column)."""
    if "block_size" in curve.columns:
        curve = curve.set_index("block_size")
    gap = default_gap(curve, recommended, tolerance)
    if gap is not None:
        return (f"keep the default block size, {DEFAULT_BLOCK} tokens: the best, {recommended}, is only "
                f"{100 * gap:.1f}% ahead (within {100 * tolerance:g}%, less than this model can tell apart)")
    return (f"recommended block size: {recommended} tokens (within {100 * tolerance:g}%: "
            f"{good_range[0]}-{good_range[1]})")
