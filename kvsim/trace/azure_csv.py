"""A pandas-free reader for well-formed Azure LLM inference CSV files (the common case).

`kvsim run TRACE.csv` spent more CPU importing pandas (about 0.3 s) than simulating 3,000 requests
(bench/vs_distserve.py). `read_plain_azure(path)` reads a file that is plainly well formed, namely:
UTF-8 (a leading byte-order mark allowed), the header exactly `TIMESTAMP,ContextTokens,GeneratedTokens`,
then one row per line, no blank line and no quote anywhere, each row three fields: a timestamp
`YYYY-MM-DD HH:MM:SS[.fraction]` (a space or `T` between date and time, up to 9 fraction digits, no
time zone) and two token counts of 1-15 digits. Anything else returns None and the caller
(`kvsim.trace.formats.read_trace`) reads the file with pandas as before, so every error message and
every unusual-but-valid file stays exactly as it was.

Seconds are computed as pandas computes them (`(stamps - stamps[0]).dt.total_seconds()`, pandas 3.1:
integer seconds plus the sub-second residual / ticks per second), from nanosecond ticks; the division
of an exact residual by an exact power of ten rounds the same at every tick unit, so the result is
bit-identical to the pandas path (tests/trace/test_azure_fast.py checks it against pandas on every
shipped Azure file). Spans of 2**53 ns (104 days) or more go to pandas (its extra rounding guard).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"
_ROW = re.compile(r"(\d{4}-\d{2}-\d{2})[ T](\d{2}:\d{2}:\d{2}(?:\.\d{1,9})?),(\d{1,15}),(\d{1,15})\r?")
_NS_PER_S = 10 ** 9


def read_plain_azure(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(seconds from the first row, prompt tokens, output tokens) of a plainly well-formed Azure CSV
    (module docstring), lengths as written (0 not yet clamped); None when the file is anything else."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except (OSError, UnicodeDecodeError):
        return None
    if '"' in text or "\0" in text:
        return None
    lines = text.split("\n")            # only \n (and \r\n) end a row, as for pandas' reader
    if lines[-1] == "":
        lines.pop()
    lines[0] = lines[0].removesuffix("\r")
    if len(lines) < 2 or lines[0] != HEADER:
        return None
    stamps, prompt, output = [], [], []
    match = _ROW.fullmatch
    for line in lines[1:]:
        m = match(line)
        if m is None:
            return None
        date, clock, p, o = m.groups()
        stamps.append(f"{date}T{clock}")
        prompt.append(p)
        output.append(o)
    try:
        ticks = np.array(stamps, dtype="datetime64[ns]").astype(np.int64)
    except ValueError:           # a date numpy refuses (month 13, ...): pandas says which row
        return None
    span = ticks - ticks[0]
    if np.abs(span).max() >= 2 ** 53:
        return None
    floor_s, residual = np.divmod(span, _NS_PER_S)
    seconds = floor_s + residual / _NS_PER_S
    return seconds, np.array(prompt, dtype=np.int64), np.array(output, dtype=np.int64)
