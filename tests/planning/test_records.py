"""`kvsim.planning.records.records` against pandas itself, the reference it stands in for
(`pandas.DataFrame(rows).to_dict("records")`), and hand-worked cases."""

import math

import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from kvsim.planning.records import records

NAN = float("nan")
_ABSENT = object()
VALUES = st.sampled_from([1, 0, -3, 2**40, 1.5, NAN, None, True, False, "x", "y", _ABSENT, np.int64(2),
                          np.float64(2.5), np.float64("nan"), np.bool_(True)])


def _same(a, b) -> bool:
    """Equal with the same type, NaN equal to NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) is type(b) and a == b


@settings(max_examples=400, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcd"), VALUES, max_size=4), min_size=1, max_size=5))
def test_records_are_what_pandas_makes_of_the_rows(rows):
    rows = [{k: v for k, v in row.items() if v is not _ABSENT} for row in rows]
    want, got = pd.DataFrame(rows).to_dict("records"), records(rows)
    assert [list(r) for r in got] == [list(r) for r in want]
    assert all(_same(g[k], w[k]) for g, w in zip(got, want) for k in w), (rows, want, got)


def test_records_by_hand():
    """Keys in first-seen order; ints beside a missing value become floats, a missing string NaN, a
    missing bool NaN beside the kept True, None alone stays None, None beside a float NaN."""
    got = records([{"n": 1, "s": "ok", "b": True, "z": None, "f": None},
                   {"n": 2, "s": "ok", "z": None, "f": 0.5},
                   {"s": None, "b": np.bool_(False), "z": None, "f": np.float64(1.5), "i": np.int64(7)}])
    assert [list(r) for r in got] == [["n", "s", "b", "z", "f", "i"]] * 3
    assert [r["n"] for r in got][:2] == [1.0, 2.0] and math.isnan(got[2]["n"])
    assert got[0]["s"] == "ok" and math.isnan(got[2]["s"])
    assert got[0]["b"] is True and math.isnan(got[1]["b"]) and got[2]["b"] is False
    assert [r["z"] for r in got] == [None, None, None]
    assert math.isnan(got[0]["f"]) and got[1]["f"] == 0.5 and type(got[2]["f"]) is float
    assert math.isnan(got[0]["i"]) and got[2]["i"] == 7.0 and type(got[2]["i"]) is float
    assert records([{"k": 3}, {"k": np.int64(4)}]) == [{"k": 3}, {"k": 4}]
    assert type(records([{"k": np.int64(4)}])[0]["k"]) is int
