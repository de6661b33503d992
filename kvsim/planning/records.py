"""Rows of scalars as one table's records, without pandas: what `pandas.DataFrame(rows).to_dict("records")`
gives (pandas 3), so a command that only prints and writes its rows (`kvsim capacity --slo`) need not
import pandas (and pyarrow: about 0.4 s of a process that searches for 2 s).

Every record has every key, in the order the keys first appear; each key's values take one type, as a
DataFrame column infers it:

- whole numbers only, none missing: `int`;
- numbers (some fractional, or some missing, None or NaN): `float`, a missing value NaN;
- strings and missing values: the strings, a missing value (None included) NaN;
- True/False only, none missing: `bool`;
- None only: None; None beside a missing value or NaN: NaN;
- any other mix: each value as it is (numpy scalars as Python's), a missing value NaN, None kept.

>>> records([{"a": 1, "b": "x"}, {"a": 2.5, "c": True}])
[{'a': 1.0, 'b': 'x', 'c': nan}, {'a': 2.5, 'b': nan, 'c': True}]
"""

from __future__ import annotations

import math
from numbers import Integral, Real
from typing import Any, Iterable, Mapping

_MISSING = object()
_NAN = float("nan")


def _kind(v: Any) -> str:
    """'m' missing, 'N' None, 'n' NaN, 'b' bool, 'i' whole number, 'f' float, 's' str, 'o' other."""
    if v is _MISSING:
        return "m"
    if v is None:
        return "N"
    if isinstance(v, bool) or type(v).__name__ == "bool_":
        return "b"
    if isinstance(v, Integral):
        return "i"
    if isinstance(v, Real):
        return "n" if math.isnan(v) else "f"
    return "s" if isinstance(v, str) else "o"


def _native(v: Any) -> Any:
    """A numpy scalar as the Python one (`.item()`); anything else as it is."""
    return v.item() if hasattr(v, "item") and type(v).__module__ == "numpy" else v


def _column(values: list) -> list:
    """One key's values (`_MISSING` where a row lacks it) as the column's records hold them."""
    kinds = {_kind(v) for v in values}
    nulls, present = kinds & {"m", "N", "n"}, kinds - {"m", "N", "n"}
    if not present:
        return [None] * len(values) if nulls == {"N"} else [_NAN] * len(values)
    if present <= {"i", "f"}:
        if present == {"i"} and not nulls:
            return [int(v) for v in values]
        return [_NAN if _kind(v) in "mNn" else float(v) for v in values]
    if present == {"s"}:
        return [_NAN if _kind(v) in "mNn" else v for v in values]
    if present == {"b"} and not nulls:
        return [bool(v) for v in values]
    return [_NAN if v is _MISSING else _native(v) for v in values]


def records(rows: Iterable[Mapping[str, Any]]) -> list[dict]:
    """`rows` (mappings of scalars) as `pandas.DataFrame(rows).to_dict("records")` gives them (module
    docstring)."""
    rows = list(rows)
    keys = list(dict.fromkeys(k for row in rows for k in row))
    columns = [_column([row.get(k, _MISSING) for row in rows]) for k in keys]
    return [dict(zip(keys, values)) for values in zip(*columns)] if keys else [{} for _ in rows]
