"""Readers for real-trace formats, format detection, and what a conversion changed.

Formats (`--format`): `jsonl` (kvsim's own, see kvsim.trace.jsonl), `azure` (Azure LLM inference CSV:
`TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP a datetime), `mooncake` (JSONL: `timestamp` in ms,
`input_length`, `output_length`, `hash_ids` over 512-token blocks), `vidur` (Vidur/Splitwise CSV:
`num_prefill_tokens,num_decode_tokens` and optionally `arrived_at` in seconds). `auto` looks at the
first line. `load_trace` is the one entry point for every format (`read_trace` adds what a
conversion changed). Conventions, the same for every reader:
- arrival_s is seconds from the first request (timestamps are shifted so the trace starts at 0);
- timestamps must not decrease (an error, not a silent sort);
- a length of 0 tokens (prompt or output) becomes 1 and is counted in the ConversionReport; a negative
  or non-integer length is an error;
- a file without timestamps (Vidur lengths files) gets arrival_s = 0 for every request, or, with
  `rate`, Poisson arrivals at `rate` requests/s drawn with `seed`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from kvsim.trace.azure_csv import read_plain_azure
from kvsim.trace.table import Trace
from kvsim.trace.text import (DuplicateKeyError, TraceError, check_trace_file, json_objects, text_lines,
                              unique_keys)
from kvsim.trace.jsonl import MOONCAKE_BLOCK, read_jsonl
from kvsim.trace.synthetic import poisson_arrivals

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("auto", "jsonl", "azure", "mooncake", "vidur")
MOONCAKE_HASH_BLOCK_SIZE = 512     # tokens per Mooncake hash_ids block
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
VIDUR_COLUMNS = ("num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class ConversionReport:
    """What reading a file changed: requests read, lengths clamped from 0 to 1, synthetic arrivals."""

    source: str
    format: str
    requests: int
    zero_prompt_clamped: int = 0
    zero_output_clamped: int = 0
    arrivals: str = "from the file"      # or "all 0" / "Poisson, R req/s, seed S"


def detect_format(path: str | Path) -> str:
    """The format of `path` from its first non-blank line: a JSON object's keys or a CSV header."""
    path = Path(path)
    for lineno, line in text_lines(path):
        if line.strip():
            break
    else:
        raise TraceError(f"{path}:1: empty file, no requests")
    if line.lstrip().startswith("{"):
        try:
            keys = json.loads(line, object_pairs_hook=unique_keys).keys()
        except DuplicateKeyError as e:
            raise TraceError(f"{path}:{lineno}: field {e.key!r} appears twice in one request") from None
        except (json.JSONDecodeError, AttributeError):
            raise TraceError(f"{path}:{lineno}: malformed JSON, cannot detect the format") from None
        if "input_length" in keys or "hash_ids" in keys:
            return "mooncake"
        if "arrival_s" in keys or "prompt_tokens" in keys:
            return "jsonl"
        raise TraceError(f"{path}:{lineno}: fields {sorted(keys)} match no format; "
                         "expected 'arrival_s'/'prompt_tokens' (jsonl) or 'input_length' (mooncake)")
    header = {c.strip() for c in line.split(",")}
    if header >= set(AZURE_COLUMNS):
        return "azure"
    if header >= set(VIDUR_COLUMNS):
        return "vidur"
    raise TraceError(f"{path}:{lineno}: CSV columns {sorted(header)} match no format; expected "
                     f"{','.join(AZURE_COLUMNS)} (azure) or {','.join(VIDUR_COLUMNS)} (vidur)")


def read_trace(path: str | Path, format: str = "auto", *, rate: float | None = None, seed: int = 0,
               hash_block_size: int | None = None) -> tuple[Trace, ConversionReport]:
    """Read `path` in `format` (or detect it); `rate` (req/s) and `seed` only for files without timestamps,
    `hash_block_size` (tokens) only for kvsim JSONL with block_hashes. Raises TraceError."""
    if format not in FORMATS:
        raise ValueError(f"unknown format {format!r}; known: {', '.join(FORMATS)}")
    path = Path(path)
    check_trace_file(path)
    fmt = detect_format(path) if format == "auto" else format
    if rate is not None and fmt != "vidur":
        raise TraceError(f"{path}: rate applies only to files without timestamps (vidur lengths files)")
    if hash_block_size is not None and fmt != "jsonl" and not (fmt == "mooncake" and hash_block_size == MOONCAKE_BLOCK):
        raise TraceError(f"{path}: hash block size {hash_block_size} does not apply to a {fmt} trace ("
                         + (f"its hash_ids cover {MOONCAKE_BLOCK}-token blocks)" if fmt == "mooncake"
                            else "it has no block hashes)"))
    if fmt == "jsonl":
        trace = read_jsonl(path, hash_block_size=hash_block_size)
        return trace, ConversionReport(path.name, fmt, len(trace))
    if fmt == "mooncake":
        return _read_mooncake(path)
    plain = read_plain_azure(path) if fmt == "azure" else None
    if plain is not None:       # the common well-formed file, read without importing pandas
        seconds, prompt, output = plain
        _check_order(path, "TIMESTAMP", seconds, " (from the first row)")
        return _build(path, fmt, seconds, prompt, output)
    import pandas as pd         # here, not at the top: importing pandas costs more than a small run

    frame = _read_csv(path, AZURE_COLUMNS if fmt == "azure" else VIDUR_COLUMNS)
    if fmt == "azure":
        stamps = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601", errors="coerce")
        _first_bad(path, "TIMESTAMP", stamps.isna().to_numpy(), frame["TIMESTAMP"], "a datetime")
        seconds = (stamps - stamps.iloc[0]).dt.total_seconds().to_numpy()
        _check_order(path, "TIMESTAMP", seconds, " (from the first row)")
        return _finish(path, fmt, seconds, frame["ContextTokens"], frame["GeneratedTokens"])
    lengths = (frame["num_prefill_tokens"], frame["num_decode_tokens"])
    if "arrived_at" in frame:
        if rate is not None:
            raise TraceError(f"{path}:1: rate applies only to files without timestamps (this one has 'arrived_at')")
        seconds = _numbers(path, "arrived_at", frame["arrived_at"])
        _check_order(path, "arrived_at", seconds, "")
        return _finish(path, fmt, seconds - seconds[0], *lengths)
    if rate is None:
        return _finish(path, fmt, np.zeros(len(frame)), *lengths, arrivals="all 0")
    seconds = np.round(poisson_arrivals(rate, np.random.default_rng(seed), num=len(frame)), 6)
    return _finish(path, fmt, seconds, *lengths, arrivals=f"Poisson, {rate:g} req/s, seed {seed}")


def load_trace(path: str | Path, format: str = "auto", *, rate: float | None = None, seed: int = 0,
               hash_block_size: int | None = None) -> Trace:
    """The trace alone from `read_trace` (the entry point the CLI and the Python API use)."""
    return read_trace(path, format, rate=rate, seed=seed, hash_block_size=hash_block_size)[0]


def _read_csv(path: Path, columns: tuple[str, ...]) -> pd.DataFrame:
    import pandas as pd

    try:
        frame = pd.read_csv(path, dtype=str, skipinitialspace=True, encoding="utf-8-sig")
    except UnicodeDecodeError:
        for _ in text_lines(path):     # raises, naming the line of the first byte that is not UTF-8
            pass
        raise TraceError(f"{path}: not UTF-8 text") from None
    except (pd.errors.ParserError, pd.errors.EmptyDataError) as e:
        raise TraceError(f"{path}: unreadable CSV: {' '.join(str(e).split())}") from None
    for col in columns:
        if col not in frame:
            raise TraceError(f"{path}:1: missing column {col!r} (expected {','.join(columns)})")
    if frame.empty:
        raise TraceError(f"{path}:2: no requests")
    return frame


def _first_bad(path: Path, field: str, bad: np.ndarray, values: pd.Series, rule: str) -> None:
    hits = np.flatnonzero(bad)
    if len(hits):
        i = int(hits[0])
        raise TraceError(f"{path}:{i + 2}: field {field!r} must be {rule}, got {values.iloc[i]!r}")


def _numbers(path: Path, field: str, values: pd.Series) -> np.ndarray:
    import pandas as pd

    x = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
    _first_bad(path, field, ~np.isfinite(x) | (x < 0), values, "a finite number >= 0")
    return x


def _check_order(path: Path, field: str, seconds: np.ndarray, origin: str) -> None:
    """TraceError at the first row whose time (`origin` says from when, for the message) goes back."""
    back = np.flatnonzero(np.diff(seconds) < 0)
    if len(back):
        i = int(back[0]) + 1
        raise TraceError(f"{path}:{i + 2}: field {field!r} must be non-decreasing, got "
                         f"{seconds[i]:.6f} s after {seconds[i - 1]:.6f} s{origin}")


def _lengths(path: Path, field: str, values: pd.Series) -> np.ndarray:
    """Token counts as int64 (a 0 kept: `_build` clamps and counts it)."""
    x = _numbers(path, field, values)
    _first_bad(path, field, x != np.floor(x), values, "an integer >= 0 (tokens)")
    return x.astype(np.int64)


def _finish(path: Path, fmt: str, seconds: np.ndarray, prompt: pd.Series, output: pd.Series,
            hashes: list[list[int]] | None = None, hash_block_size: int | None = None,
            arrivals: str = "from the file") -> tuple[Trace, ConversionReport]:
    """Clamp lengths (CSV line numbers in errors) and build the trace with its report."""
    p = _lengths(path, str(prompt.name), prompt)
    o = _lengths(path, str(output.name), output)
    return _build(path, fmt, seconds, p, o, hashes, hash_block_size, arrivals)


def _build(path: Path, fmt: str, seconds: np.ndarray, prompt: np.ndarray, output: np.ndarray,
           hashes: list[list[int]] | None = None, hash_block_size: int | None = None,
           arrivals: str = "from the file") -> tuple[Trace, ConversionReport]:
    """The trace of checked int64 token counts, a length of 0 clamped to 1 and counted in the report."""
    p_zero, o_zero = prompt == 0, output == 0
    prompt, output = np.where(p_zero, 1, prompt), np.where(o_zero, 1, output)
    trace = Trace.from_arrays(seconds, prompt, output, block_hashes=hashes, hash_block_size=hash_block_size,
                              source=path.name)
    return trace, ConversionReport(path.name, fmt, len(trace), int(p_zero.sum()), int(o_zero.sum()), arrivals)


def _read_mooncake(path: Path) -> tuple[Trace, ConversionReport]:
    """Mooncake JSONL; line numbers are 1-based and count every line (no header)."""
    stamps, prompt, output, hashes = [], [], [], []
    for _, where, rec in json_objects(path):
        try:
            row = [rec[k] for k in ("timestamp", "input_length", "output_length")]
        except KeyError as e:
            raise TraceError(f"{where}: missing required field {e.args[0]!r}") from None
        for key, v in zip(("timestamp", "input_length", "output_length"), row):
            if (type(v) not in (int, float) or not math.isfinite(v) or v < 0
                    or (key != "timestamp" and v != int(v))):
                raise TraceError(f"{where}: field {key!r} must be a number >= 0"
                                 f"{'' if key == 'timestamp' else ' (integer tokens)'}, got {json.dumps(v)}")
        h = rec.get("hash_ids") or []
        if not isinstance(h, list) or any(type(x) is not int for x in h):
            raise TraceError(f"{where}: field 'hash_ids' must be a list of integers")
        if len(h) > -(-row[1] // MOONCAKE_HASH_BLOCK_SIZE):
            raise TraceError(f"{where}: field 'hash_ids' has {len(h)} entries, more than the "
                             f"{-(-row[1] // MOONCAKE_HASH_BLOCK_SIZE)} blocks of 512 tokens in the prompt")
        if stamps and row[0] < stamps[-1]:
            raise TraceError(f"{where}: field 'timestamp' must be non-decreasing, got {row[0]} ms "
                             f"after {stamps[-1]} ms")
        stamps.append(row[0])
        prompt.append(row[1])
        output.append(row[2])
        hashes.append(h)
    if not stamps:
        raise TraceError(f"{path}:1: empty file, no requests")
    seconds = (np.array(stamps, dtype=np.float64) - stamps[0]) / 1000.0
    # checked above as whole numbers >= 0; through float64 as the CSV readers' pd.to_numeric goes
    return _build(path, "mooncake", seconds, np.array(prompt, dtype=np.float64).astype(np.int64),
                  np.array(output, dtype=np.float64).astype(np.int64), hashes, MOONCAKE_HASH_BLOCK_SIZE)
