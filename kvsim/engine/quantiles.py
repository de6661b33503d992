"""Percentiles of a run's per-request times, computed as `numpy.percentile` computes them (its default
'linear' method: the value at virtual index (n - 1) x q / 100 of the sorted values, interpolated by its
`_lerp`, from the upper neighbour when the fraction is 0.5 or more), bit for bit, without its first call's
cost: that call imports numpy's masked arrays and `inspect` (about 8 ms on this machine, a sixtieth of a
3,000-request `kvsim run`). Checked against `numpy.percentile` in tests/engine/test_quantiles.py.
"""

from __future__ import annotations

import math

import numpy as np


def percentiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """`numpy.percentile(values, qs)` as floats (`values`: a non-empty 1-d float array; NaN when one
    value is NaN, as numpy gives)."""
    ordered = np.sort(values)
    n = len(ordered)
    if ordered[-1] != ordered[-1]:               # NaN sorts last
        return [math.nan] * len(qs)
    out = []
    for q in qs:
        at = (n - 1) * (q / 100)
        if at >= n - 1:
            out.append(float(ordered[-1]))
            continue
        below = math.floor(at)
        t = at - below
        a, b = float(ordered[below]), float(ordered[below + 1])
        diff = b - a
        out.append(b - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out
