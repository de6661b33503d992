"""`kvsim.engine.quantiles.percentiles` gives `numpy.percentile`'s values bit for bit (numpy is the
reference), and by hand on a few small cases."""

import math

import numpy as np
from hypothesis import given, settings, strategies as st

from kvsim.engine.quantiles import percentiles

QS = (0, 50, 90, 99, 100)


def test_by_hand():
    """Four values 1, 2, 4, 8: the median sits at index 1.5 (2 + 2 x 0.5 = 3, from the upper neighbour:
    4 - 2 x 0.5), p90 at 2.7 (8 - 4 x 0.3 = 6.8), p99 at 2.97; one value is every percentile."""
    p0, p50, p90, p99, p100 = percentiles(np.array([8.0, 1.0, 4.0, 2.0]), QS)
    assert (p0, p50, p100) == (1.0, 3.0, 8.0)
    assert math.isclose(p90, 6.8) and math.isclose(p99, 7.88)
    assert percentiles(np.array([2.5]), QS) == [2.5] * 5
    assert all(math.isnan(p) for p in percentiles(np.array([1.0, math.nan]), QS))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(min_value=0, max_value=1e6, allow_nan=False) | st.integers(0, 50).map(float),
                min_size=1, max_size=60))
def test_the_same_bits_as_numpy(values):
    x = np.array(values, np.float64)
    want = [float(v) for v in np.percentile(x, QS)]
    assert [p.hex() for p in percentiles(x, QS)] == [w.hex() for w in want]
