"""Reading trace files as text: `TraceError`, the checks every reader makes before parsing (a file, not
compressed, UTF-8) and JSON objects without repeated keys. The format readers (`kvsim.trace.jsonl`,
`kvsim.trace.formats`) build on these; messages name the file, the line and the column.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator


class TraceError(ValueError):
    """A trace file is malformed; the message names the file, the line and the field."""


#: Leading bytes of files that are not text, and what to tell the user.
_NOT_TEXT = {b"\x1f\x8b": "gzip-compressed; decompress it first (gunzip)",
             b"PK\x03\x04": "a zip archive; extract the trace first",
             b"BZh": "bzip2-compressed; decompress it first (bunzip2)",
             b"\xfd7zXZ": "xz-compressed; decompress it first (unxz)",
             b"\x28\xb5\x2f\xfd": "zstd-compressed; decompress it first (unzstd)",
             b"\xff\xfe": "UTF-16 text; kvsim reads UTF-8 (convert with iconv -f UTF-16 -t UTF-8)",
             b"\xfe\xff": "UTF-16 text; kvsim reads UTF-8 (convert with iconv -f UTF-16 -t UTF-8)"}
_NOT_UTF8 = re.compile("[\udc80-\udcff]")     # undecodable bytes, as surrogateescape keeps them


class DuplicateKeyError(ValueError):
    """A JSON object names the same key twice; `key` is the first repeated one."""

    def __init__(self, key: str) -> None:
        super().__init__(f"key {key!r} appears twice")
        self.key = key


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """`object_pairs_hook` for json.loads: the object as a dict, DuplicateKeyError on a repeated key
    (plain json.loads silently keeps the last value)."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DuplicateKeyError(key)
            seen.add(key)
    return obj


def check_trace_file(path: Path) -> None:
    """TraceError unless `path` is an existing file that starts like text (not compressed, not UTF-16)."""
    if not path.exists():
        raise TraceError(f"{path}: no such file")
    if path.is_dir():
        raise TraceError(f"{path}: is a folder, not a trace file")
    with open(path, "rb") as f:
        head = f.read(6)
    for magic, what in _NOT_TEXT.items():
        if head.startswith(magic):
            raise TraceError(f"{path}:1: the file is {what}")


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for every line of UTF-8 text file `path`, a leading byte-order mark
    dropped; TraceError naming the line and column of the first byte that is not UTF-8."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape") as f:
        for lineno, line in enumerate(f, 1):
            bad = _NOT_UTF8.search(line)
            if bad:
                raise TraceError(f"{path}:{lineno}: not UTF-8 text (byte 0x{ord(bad.group()) - 0xDC00:02x} "
                                 f"at column {bad.start() + 1}); kvsim reads UTF-8 traces")
            if "\0" in line:
                raise TraceError(f"{path}:{lineno}: a NUL byte at column {line.index(chr(0)) + 1}; "
                                 "this is a binary file, not a text trace")
            yield lineno, line


def json_objects(path: Path) -> Iterator[tuple[int, str, dict]]:
    """(line number, "path:line", object) for every non-blank line of JSON-lines file `path`; TraceError
    naming the line for malformed JSON, a key given twice, or a value that is not an object."""
    for lineno, line in text_lines(path):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line.rstrip("\r\n"), object_pairs_hook=unique_keys)
        except DuplicateKeyError as e:
            raise TraceError(f"{where}: field {e.key!r} appears twice in one request") from None
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: malformed JSON ({e.msg} at column {e.colno})") from None
        if not isinstance(rec, dict):
            raise TraceError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        yield lineno, where, rec
