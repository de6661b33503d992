"""One line of a kvsim JSONL trace, checked field by field: the slow path of `kvsim.trace.jsonl`, taken
when the columnar check fails, so that the message names the first bad line and field exactly.
The schema (fields, types, ranges) is described in `kvsim.trace.jsonl`.
"""

from __future__ import annotations

import json
import math

from kvsim.trace.text import TraceError

REQUIRED = ("arrival_s", "prompt_tokens", "output_tokens")
OPTIONAL = ("id", "n", "beam_width", "prefix_group", "prefix_tokens", "block_hashes", "output_tokens_per_sample")
KNOWN = frozenset(REQUIRED + OPTIONAL)
MAX_TOKENS = 2**31 - 1          # larger lengths are certainly a mistake
_INT64 = (-(2**63), 2**63 - 1)


def _int_field(rec: dict, key: str, where: str, low: int, high: int = MAX_TOKENS, high_name: str = "") -> int:
    v = rec[key]
    if type(v) is int and low <= v <= high:
        return v
    rule = f">= {low}" if type(v) is not int or v < low else f"<= {high}{high_name}"
    raise TraceError(f"{where}: field {key!r} must be an integer {rule}, got {json.dumps(v)}")


def check_record(rec: dict, where: str, hbs: int | None) -> dict:
    """Validate one parsed line; return its values with None for absent optional fields."""
    unknown = sorted(rec.keys() - KNOWN)
    if unknown:
        raise TraceError(f"{where}: unknown field {unknown[0]!r} (known: {', '.join(REQUIRED + OPTIONAL)})")
    for key in REQUIRED:
        if key not in rec:
            raise TraceError(f"{where}: missing required field {key!r}")
    arrival = rec["arrival_s"]
    if type(arrival) not in (int, float) or not math.isfinite(arrival) or arrival < 0:
        raise TraceError(f"{where}: field 'arrival_s' must be a finite number >= 0 (seconds), "
                         f"got {json.dumps(arrival)}")
    row = {"arrival_s": float(arrival), "prompt_tokens": _int_field(rec, "prompt_tokens", where, 1),
           "output_tokens": _int_field(rec, "output_tokens", where, 1)}
    present = {k for k in OPTIONAL if rec.get(k) is not None}
    row["n"] = _int_field(rec, "n", where, 1) if "n" in present else None
    row["beam_width"] = _int_field(rec, "beam_width", where, 1) if "beam_width" in present else None
    row["id"] = rec.get("id")
    if row["id"] is not None and not isinstance(row["id"], str):
        raise TraceError(f"{where}: field 'id' must be a string, got {json.dumps(row['id'])}")
    row["prefix_group"], row["prefix_tokens"] = rec.get("prefix_group"), None
    if ("prefix_group" in present) != ("prefix_tokens" in present):
        missing = "prefix_tokens" if "prefix_group" in present else "prefix_group"
        raise TraceError(f"{where}: field {missing!r} is required when "
                         f"{'prefix_group' if missing == 'prefix_tokens' else 'prefix_tokens'!r} is given")
    if "prefix_group" in present:
        if not isinstance(row["prefix_group"], str) or not row["prefix_group"]:
            raise TraceError(f"{where}: field 'prefix_group' must be a non-empty string, "
                             f"got {json.dumps(row['prefix_group'])}")
        row["prefix_tokens"] = _int_field(rec, "prefix_tokens", where, 1, row["prompt_tokens"], " (prompt_tokens)")
    hashes = rec.get("block_hashes")
    if hashes is not None:
        if not isinstance(hashes, list) or any(type(h) is not int or not _INT64[0] <= h <= _INT64[1]
                                               for h in hashes):
            raise TraceError(f"{where}: field 'block_hashes' must be a list of 64-bit integers")
        if hashes and "prefix_group" in present:
            raise TraceError(f"{where}: field 'block_hashes' cannot be combined with 'prefix_group'")
        if hbs is not None and len(hashes) > -(-row["prompt_tokens"] // hbs):
            raise TraceError(f"{where}: field 'block_hashes' has {len(hashes)} entries, more than the "
                             f"{-(-row['prompt_tokens'] // hbs)} blocks of {hbs} tokens in the prompt")
    row["block_hashes"] = hashes
    row["output_tokens_per_sample"] = _check_sample_lengths(rec.get("output_tokens_per_sample"), row, where)
    return row


def _check_sample_lengths(lengths, row: dict, where: str) -> list[int] | None:
    """`output_tokens_per_sample` of one record, checked against its `n`, `beam_width` and
    `output_tokens` (TraceError naming the field), or None when absent."""
    if lengths is None:
        return None
    n, out = row["n"] or 1, row["output_tokens"]
    field = f"{where}: field 'output_tokens_per_sample'"
    if not isinstance(lengths, list) or any(type(v) is not int for v in lengths):
        raise TraceError(f"{field} must be a list of integers (one output length per sample), "
                         f"got {json.dumps(lengths)}")
    if (row["beam_width"] or 1) > 1:
        raise TraceError(f"{field} cannot be combined with 'beam_width' > 1 (beams all run to output_tokens)")
    if len(lengths) != n:
        raise TraceError(f"{field} must hold n = {n} lengths, got {len(lengths)}")
    if any(not 1 <= v <= out for v in lengths) or max(lengths) != out:
        raise TraceError(f"{field} must hold lengths in [1, output_tokens = {out}] with {out} the largest, "
                         f"got {json.dumps(lengths)}")
    return lengths
