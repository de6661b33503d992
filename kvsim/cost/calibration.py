"""Reading `kvsim-calibration/1` files (docs/calibration-format.md) written by `gpu_harness`.

Only the `fit` section feeds the cost model; `measurements` are kept in the file for re-fitting and are
not read here. Units: seconds, bytes, bytes/s.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from dataclasses import dataclass
from pathlib import Path

from kvsim.files import read_json_object

CALIBRATION_FORMAT = "kvsim-calibration/1"

_FIXED_FIELDS = ("decode_attn_fixed_s", "store_kv_fixed_s")           # >= 0
_RATE_FIELDS = ("decode_attn_bytes_per_s", "store_kv_bytes_per_s")    # > 0


@dataclass(frozen=True, slots=True)
class Calibration:
    """Measured decode-attention and KV-store costs of one GPU, per layer and per kernel launch.

    Decode attention on one layer reading `B` bytes of KV costs
    `decode_attn_fixed_s + B / decode_attn_bytes_per_s` seconds (contiguous kernel), times
    `paged_overhead_at(block_size)` for the paged kernel. A KV write of `B` bytes costs
    `store_kv_fixed_s + B / store_kv_bytes_per_s`.
    """

    source: str
    device: str
    decode_attn_fixed_s: float
    decode_attn_bytes_per_s: float
    store_kv_fixed_s: float
    store_kv_bytes_per_s: float
    paged_overhead: tuple[tuple[int, float], ...]   # (block_size, paged/contiguous time), ascending

    def paged_overhead_at(self, block_size: int) -> float:
        """Paged/contiguous decode time at `block_size`: linear in log2(block size) between measured
        sizes, clamped to the smallest or largest measured size outside their range."""
        sizes = [bs for bs, _ in self.paged_overhead]
        i = bisect_right(sizes, block_size)
        if i == 0:
            return self.paged_overhead[0][1]
        if i == len(sizes):
            return self.paged_overhead[-1][1]
        (b0, f0), (b1, f1) = self.paged_overhead[i - 1], self.paged_overhead[i]
        w = (math.log2(block_size) - math.log2(b0)) / (math.log2(b1) - math.log2(b0))
        return f0 + w * (f1 - f0)


def _number(path: Path, fit: dict, field: str, positive: bool) -> float:
    value = fit.get(field)
    if value is None:
        raise ValueError(f"{path}: field 'fit.{field}' is missing")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}: field 'fit.{field}' must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        bound = "positive" if positive else "non-negative"
        raise ValueError(f"{path}: field 'fit.{field}' must be {bound}, got {value!r}")
    return float(value)


def _paged_overhead(path: Path, raw) -> tuple[tuple[int, float], ...]:
    if not isinstance(raw, dict) or not raw:
        raise ValueError(f"{path}: field 'fit.paged_overhead' must be a non-empty object "
                         f"{{block_size: factor}}, got {raw!r}")
    points = []
    for key, factor in raw.items():
        if not str(key).isdigit() or int(key) < 1:
            raise ValueError(f"{path}: field 'fit.paged_overhead' has block size {key!r}; "
                             "block sizes must be positive integers")
        if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
            raise ValueError(f"{path}: field 'fit.paged_overhead.{key}' must be a positive number, "
                             f"got {factor!r}")
        points.append((int(key), float(factor)))
    return tuple(sorted(points))


def load_calibration(path: str | Path, force: bool = False) -> Calibration:
    """Read and validate a calibration file; `ValueError` naming the file and field on any problem.

    Files with `usable_for_prediction: false` (timings from the Triton CPU interpreter) are refused
    unless `force=True`.
    """
    path = Path(path)
    doc = read_json_object(path, "calibration file")
    if doc.get("format") != CALIBRATION_FORMAT:
        raise ValueError(f"{path}: field 'format' must be {CALIBRATION_FORMAT!r}, got {doc.get('format')!r}")
    usable = doc.get("usable_for_prediction")
    if not isinstance(usable, bool):
        raise ValueError(f"{path}: field 'usable_for_prediction' must be true or false, got {usable!r}")
    if not usable and not force:
        raise ValueError(
            f"{path}: usable_for_prediction is false (backend {doc.get('backend')!r}, device "
            f"{doc.get('device')!r}): these timings come from the Triton interpreter on a CPU, not from a "
            "GPU, so step times predicted from them would be meaningless; pass force=True to use them "
            "anyway (for testing the pipeline only)")
    fit = doc.get("fit")
    if not isinstance(fit, dict):
        raise ValueError(f"{path}: field 'fit' is missing or not an object")
    values = {f: _number(path, fit, f, positive=False) for f in _FIXED_FIELDS}
    values.update({f: _number(path, fit, f, positive=True) for f in _RATE_FIELDS})
    return Calibration(source=str(path), device=str(doc.get("device", "unknown")),
                       paged_overhead=_paged_overhead(path, fit.get("paged_overhead")), **values)
