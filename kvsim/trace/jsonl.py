"""The kvsim JSONL trace format (DESIGN.md): read with validation, write.

One JSON object per line. Required: `arrival_s` (seconds from the trace start, a number >= 0,
non-decreasing), `prompt_tokens` and `output_tokens` (integers >= 1). Optional: `id` (string, unique;
default the request's 1-based position), `n` and `beam_width` (integers >= 1, default 1), `prefix_group`
(non-empty string) with `prefix_tokens` (integer in [1, prompt_tokens]; the two go together),
`block_hashes` (list of integers, one per prompt block of the hash block size; not together with
`prefix_group`), `output_tokens_per_sample` (list of n integers in [1, output_tokens], the largest equal
to `output_tokens`: each sample's own length; not with `beam_width` > 1). A null optional value means the field is absent; unknown fields are errors; blank
lines are skipped. Every error is a `TraceError` naming file, line and field.

Reading is columnar: chunks of lines are parsed as one JSON array each and checked vectorised, which
loads a million requests in a few seconds (bench/trace_load.py). When anything fails that check the file
is read again line by line, which reports the first bad line precisely.
"""

from __future__ import annotations

import json
from dataclasses import replace
from itertools import chain, islice
from pathlib import Path

import numpy as np

from kvsim.files import atomic_write
from kvsim.trace.table import Trace
from kvsim.trace.jsonl_record import KNOWN, MAX_TOKENS, OPTIONAL, REQUIRED, check_record
from kvsim.trace.text import TraceError, json_objects, unique_keys

_CHUNK_LINES = 65536


class _Fallback(Exception):
    """The fast path met something it does not accept; the line scan will say what."""


def read_jsonl(path: str | Path, *, hash_block_size: int | None = None) -> Trace:
    """Read and validate a kvsim JSONL trace; `hash_block_size` (tokens) is what `block_hashes` used."""
    path = Path(path)
    try:
        trace = _read_fast(path, hash_block_size)
    except _Fallback:
        trace = _read_by_line(path, hash_block_size)
    if hash_block_size is None and trace.hash_offsets is not None and _mooncake_blocks(trace):
        trace = replace(trace, hash_block_size=MOONCAKE_BLOCK)
    return trace


MOONCAKE_BLOCK = 512     # tokens per block of the Mooncake trace's hash_ids


def _mooncake_blocks(trace: Trace) -> bool:
    """Whether `block_hashes` given without their block size are Mooncake's 512-token `hash_ids`: every
    request has floor or ceil(prompt / 512) of them, and some prompt is long enough (>= 1024 tokens) that
    blocks of the run's size (<= 256 tokens) would have given at least twice as many. Read as blocks of
    the run's size they would undercount hits ~block-size-ratio-fold, silently."""
    lengths = np.diff(trace.hash_offsets)
    has = lengths > 0
    prompt = trace.prompt_tokens[has]
    count = lengths[has]
    return bool(np.all((count >= prompt // MOONCAKE_BLOCK) & (count <= -(-prompt // MOONCAKE_BLOCK)))
                and np.any(prompt >= 2 * MOONCAKE_BLOCK))


def write_jsonl(trace: Trace, path: str | Path, flag: str | None = None) -> None:
    """Write `trace` as kvsim JSONL, whole or not at all; optional fields appear only where they differ
    from their default. Write errors name `path` and, given, the `flag` that chose it."""
    has_ids, groups = trace.ids is not None, trace.prefix_group
    with atomic_write(path, flag=flag) as f:
        for start in range(0, len(trace), _CHUNK_LINES):
            rows = range(start, min(start + _CHUNK_LINES, len(trace)))
            arrival, prompt, output = (trace.arrival_s[rows.start:rows.stop].tolist(),
                                       trace.prompt_tokens[rows.start:rows.stop].tolist(),
                                       trace.output_tokens[rows.start:rows.stop].tolist())
            lines = []
            for k, i in enumerate(rows):
                head = f'{{"id": {json.dumps(trace.ids[i])}, ' if has_ids else "{"
                tail = ""
                if trace.n[i] != 1:
                    tail += f', "n": {trace.n[i]}'
                if trace.beam_width[i] != 1:
                    tail += f', "beam_width": {trace.beam_width[i]}'
                if groups is not None and groups[i] >= 0:
                    tail += (f', "prefix_group": {json.dumps(trace.prefix_group_names[groups[i]])}'
                             f', "prefix_tokens": {trace.prefix_tokens[i]}')
                if trace.hash_offsets is not None and trace.hash_offsets[i + 1] > trace.hash_offsets[i]:
                    tail += f', "block_hashes": [{", ".join(map(str, trace.block_hashes(i).tolist()))}]'
                lengths = trace.sample_lengths(i) if trace.sample_offsets is not None else None
                if lengths is not None:
                    tail += f', "output_tokens_per_sample": {json.dumps(lengths)}'
                lines.append(f'{head}"arrival_s": {arrival[k]!r}, "prompt_tokens": {prompt[k]}, '
                             f'"output_tokens": {output[k]}{tail}}}\n')
            f.write("".join(lines))


def _types(values: list) -> set[type]:
    return set(map(type, values))


def _read_fast(path: Path, hbs: int | None) -> Trace:
    cols: dict[str, list] = {k: [] for k in REQUIRED + OPTIONAL}
    lengths: list[np.ndarray] = []
    with open(path, encoding="utf-8-sig") as f:
        while True:
            try:
                lines = list(islice(f, _CHUNK_LINES))
            except UnicodeDecodeError as e:
                raise _Fallback from e
            if not lines:
                break
            try:
                recs = json.loads("[" + ",".join(lines) + "]", object_pairs_hook=unique_keys)
                keys = set().union(*recs)
                if len(recs) != len(lines) or not keys <= KNOWN:
                    raise _Fallback
                for k in REQUIRED:
                    cols[k].append([r[k] for r in recs])
                for k in OPTIONAL:
                    cols[k].append([r.get(k) for r in recs] if k in keys else [None] * len(recs))
            except (ValueError, TypeError, AttributeError, KeyError) as e:
                raise _Fallback from e
    flat = {k: list(chain.from_iterable(v)) for k, v in cols.items()}
    if not flat["arrival_s"]:
        raise _Fallback
    if not (_types(flat["arrival_s"]) <= {int, float}
            and all(_types(flat[k]) <= {int} for k in ("prompt_tokens", "output_tokens"))
            and all(_types(flat[k]) <= {int, type(None)} for k in ("n", "beam_width", "prefix_tokens"))
            and _types(flat["id"]) <= {str, type(None)}
            and _types(flat["prefix_group"]) <= {str, type(None)}
            and _types(flat["block_hashes"]) <= {list, type(None)}
            and _types(flat["output_tokens_per_sample"]) <= {list, type(None)}):
        raise _Fallback
    try:
        return _build(flat, hbs, path, strict=True)
    except (ValueError, OverflowError) as e:  # a vectorised check failed: let the line scan say where
        raise _Fallback from e


def _build(cols: dict[str, list], hbs: int | None, path: Path, strict: bool) -> Trace:
    """Columns (lists, None for absent) to a Trace; with `strict`, raise ValueError on any rule broken."""
    num = len(cols["arrival_s"])
    arrival = np.array(cols["arrival_s"], dtype=np.float64)
    prompt = np.array(cols["prompt_tokens"], dtype=np.int64)
    output = np.array(cols["output_tokens"], dtype=np.int64)
    opt = {k: _ints_or(cols[k], 1) for k in ("n", "beam_width")}
    group_given = _given(cols["prefix_group"])
    ptoks = _ints_or(cols["prefix_tokens"], 0)
    hashes = cols["block_hashes"]
    hash_len = (np.zeros(num, dtype=np.int64) if hashes.count(None) == num
                else np.array([0 if h is None else len(h) for h in hashes], dtype=np.int64))
    ids = None
    if cols["id"].count(None) != num:
        ids = [str(i + 1) if v is None else v for i, v in enumerate(cols["id"])]
    if strict:
        tokens_ok = all(np.all((a >= 1) & (a <= MAX_TOKENS)) for a in (prompt, output, *opt.values()))
        hash_flat = list(chain.from_iterable(h for h in hashes if h))
        samples_flat = list(chain.from_iterable(x for x in cols["output_tokens_per_sample"] if x))
        if not (tokens_ok and np.all(np.isfinite(arrival)) and np.all(arrival >= 0)
                and _types(samples_flat) <= {int} and all(v <= MAX_TOKENS for v in samples_flat)
                and np.all(np.diff(arrival) >= 0)
                and np.array_equal(group_given, _given(cols["prefix_tokens"]))
                and np.all((ptoks[group_given] >= 1) & (ptoks[group_given] <= prompt[group_given]))
                and "" not in cols["prefix_group"]
                and not np.any(group_given & (hash_len > 0))
                and _types(hash_flat) <= {int}
                and (hbs is None or np.all(hash_len <= -(-prompt // hbs)))
                and (ids is None or len(set(ids)) == num)):
            raise ValueError("invalid trace")
    names: dict[str, int] = {}
    codes = None if not group_given.any() else np.array([names.setdefault(g, len(names)) if g is not None else -1 for g in cols["prefix_group"]],
                     dtype=np.int64)
    offsets = values = None
    if hash_len.any():
        offsets = np.zeros(num + 1, dtype=np.int64)
        np.cumsum(hash_len, out=offsets[1:])
        values = np.fromiter(chain.from_iterable(h for h in hashes if h), dtype=np.int64, count=offsets[-1])
    samples = cols["output_tokens_per_sample"]
    s_off = s_val = None
    if samples.count(None) != num:
        s_off = np.zeros(num + 1, dtype=np.int64)
        np.cumsum([len(x or ()) for x in samples], out=s_off[1:])
        s_val = np.fromiter(chain.from_iterable(x for x in samples if x), dtype=np.int64, count=s_off[-1])
    return Trace(arrival_s=arrival, prompt_tokens=prompt, output_tokens=output, n=opt["n"],
                 beam_width=opt["beam_width"], prefix_tokens=ptoks, ids=ids,
                 prefix_group=codes, prefix_group_names=tuple(names),
                 hash_offsets=offsets, hash_values=values, hash_block_size=hbs,
                 sample_offsets=s_off, sample_values=s_val, source=path.name,
                 path=str(path))


def _given(values: list) -> np.ndarray:
    """Which entries are not None (bool [N]); fast when none are."""
    if values.count(None) == len(values):
        return np.zeros(len(values), dtype=bool)
    return np.array([v is not None for v in values], dtype=bool)


def _ints_or(values: list, default: int) -> np.ndarray:
    """int64 [N] with None replaced by `default`; fast when every entry is None."""
    if values.count(None) == len(values):
        return np.full(len(values), default, dtype=np.int64)
    return np.array([default if v is None else v for v in values], dtype=np.int64)


def _read_by_line(path: Path, hbs: int | None) -> Trace:
    """The reference reader: one line at a time, raising TraceError at the first bad line."""
    cols: dict[str, list] = {k: [] for k in REQUIRED + OPTIONAL}
    seen_ids: dict[str, int] = {}
    last_arrival, last_line = 0.0, 0
    for lineno, where, rec in json_objects(path):
        row = check_record(rec, where, hbs)
        if row["arrival_s"] < last_arrival:
            raise TraceError(f"{where}: field 'arrival_s' must be non-decreasing, got "
                             f"{row['arrival_s']!r} after {last_arrival!r} on line {last_line}")
        last_arrival, last_line = row["arrival_s"], lineno
        rid = row["id"] if row["id"] is not None else str(len(cols["arrival_s"]) + 1)
        if rid in seen_ids:
            raise TraceError(f"{where}: field 'id': {rid!r} is already the id of line {seen_ids[rid]} "
                             "(a request without an id is named by its 1-based position)")
        seen_ids[rid] = lineno
        for k, v in row.items():
            cols[k].append(v)
    if not cols["arrival_s"]:
        raise TraceError(f"{path}:1: no requests (field 'arrival_s' never seen)")
    return _build(cols, hbs, path, strict=False)
