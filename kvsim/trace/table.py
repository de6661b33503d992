"""Columnar request trace: one numpy array per field, not one Python object per request.

Units: `arrival_s` in seconds from the trace start; every length in tokens. A trace may say which
leading prompt blocks requests share, either as per-block content hashes (`block_hashes`, CSR, as in the
Mooncake trace's `hash_ids`) or as a named prefix group with a shared prefix length. `prompt_block_ids`
turns either into per-block content ids at the run's block size; the allocator chains them itself.

Reading text files (and `TraceError`) lives in `kvsim.trace.text`, content ids in `kvsim.trace.block_ids`.
File formats live in `kvsim.trace.jsonl` (the kvsim JSONL schema) and `kvsim.trace.formats` (Azure,
Mooncake, Vidur/Splitwise, auto-detection, and `load_trace`, the one entry point for all of them); this
module imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kvsim.trace.block_ids import group_block_ids, split_block_ids
from kvsim.trace.checks import check_groups, check_hashes, check_samples, first_bad, frozen
from kvsim.trace.text import TraceError  # noqa: F401  (kvsim.trace.table.TraceError: the readers' error type)


def _percentiles(x: np.ndarray) -> dict[str, float]:
    if len(x) == 0:
        return {"mean": 0.0, "p50": 0.0, "p90": 0.0, "p99": 0.0, "max": 0.0}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99),
            "max": float(x.max())}


@dataclass(frozen=True, eq=False)
class Trace:
    """N requests sorted by arrival. Build with `Trace.from_arrays`; the arrays become read-only.

    `ids=None` means request i is called str(i + 1) (its line number in a JSONL file without blank
    lines). `prefix_group[i]` indexes `prefix_group_names` (-1: no group) and requests of one group share
    their first `prefix_tokens[i]` prompt tokens. Request i's block hashes are
    `hash_values[hash_offsets[i]:hash_offsets[i + 1]]`, made with blocks of `hash_block_size` tokens
    (None: the run's block size). Request i's own sample lengths (`output_tokens_per_sample`, none for
    most requests) are `sample_values[sample_offsets[i]:sample_offsets[i + 1]]`: n of them, the largest
    equal to `output_tokens` (beam_width 1 only).
    """

    arrival_s: np.ndarray          # float64 [N], seconds, non-decreasing
    prompt_tokens: np.ndarray      # int64 [N], >= 1
    output_tokens: np.ndarray      # int64 [N], >= 1
    n: np.ndarray                  # int64 [N], parallel samples, >= 1
    beam_width: np.ndarray         # int64 [N], >= 1
    prefix_tokens: np.ndarray      # int64 [N], 0 when no prefix group
    ids: list[str] | None = None
    prefix_group: np.ndarray | None = None      # int64 [N], -1 for none
    prefix_group_names: tuple[str, ...] = ()
    hash_offsets: np.ndarray | None = None      # int64 [N + 1]
    hash_values: np.ndarray | None = None       # int64 [H]
    hash_block_size: int | None = None          # tokens per hashed block
    sample_offsets: np.ndarray | None = None    # int64 [N + 1]
    sample_values: np.ndarray | None = None     # int64 [S], tokens
    source: str = ""
    path: str = ""                     # the file read (messages find a request's line there); "" otherwise

    def __post_init__(self) -> None:
        num = len(self.arrival_s)
        for name, dtype in (("arrival_s", np.float64), ("prompt_tokens", np.int64),
                            ("output_tokens", np.int64), ("n", np.int64), ("beam_width", np.int64),
                            ("prefix_tokens", np.int64)):
            a = getattr(self, name)
            if not isinstance(a, np.ndarray) or a.dtype != dtype or a.shape != (num,):
                raise ValueError(f"Trace.{name} must be a {np.dtype(dtype)} array of shape ({num},)")
            frozen(a)
        first_bad("arrival_s", ~np.isfinite(self.arrival_s) | (self.arrival_s < 0), "finite and >= 0")
        first_bad("arrival_s", np.diff(self.arrival_s) < 0, "non-decreasing", offset=1)
        for name in ("prompt_tokens", "output_tokens", "n", "beam_width"):
            first_bad(name, getattr(self, name) < 1, ">= 1")
        first_bad("prefix_tokens", (self.prefix_tokens < 0) | (self.prefix_tokens > self.prompt_tokens),
                   "in [0, prompt_tokens]")
        if self.ids is not None and (len(self.ids) != num or len(set(self.ids)) != num):
            raise ValueError(f"Trace.ids must hold {num} distinct strings")
        check_groups(self, num)
        check_hashes(self, num)
        check_samples(self, num)

    @classmethod
    def from_arrays(cls, arrival_s: Sequence[float], prompt_tokens: Sequence[int],
                    output_tokens: Sequence[int], *, n: Sequence[int] | int = 1,
                    beam_width: Sequence[int] | int = 1, ids: Sequence[str] | None = None,
                    prefix_group: Sequence[str | None] | None = None,
                    prefix_tokens: Sequence[int] | None = None,
                    block_hashes: Sequence[Sequence[int]] | None = None,
                    hash_block_size: int | None = None,
                    output_tokens_per_sample: Sequence[Sequence[int] | None] | None = None,
                    source: str = "") -> Trace:
        """Build a trace from per-request sequences (copied); scalars `n`/`beam_width` apply to all.

        `prefix_group` holds a group name or None per request; `block_hashes` a list of ints per request;
        `output_tokens_per_sample` None or a list of n lengths per request.
        """
        arr = np.array(arrival_s, dtype=np.float64)
        num = len(arr)
        codes, names = None, ()
        if prefix_group is not None:
            lookup: dict[str, int] = {}
            codes = np.array([-1 if g is None else lookup.setdefault(g, len(lookup)) for g in prefix_group],
                             dtype=np.int64)
            names = tuple(lookup)
        offsets = values = None
        if block_hashes is not None:
            offsets = np.zeros(num + 1, dtype=np.int64)
            np.cumsum([len(h) for h in block_hashes], out=offsets[1:])
            values = np.fromiter((v for h in block_hashes for v in h), dtype=np.int64, count=offsets[-1])
        s_off = s_val = None
        if output_tokens_per_sample is not None:
            s_off = np.zeros(num + 1, dtype=np.int64)
            np.cumsum([len(x or ()) for x in output_tokens_per_sample], out=s_off[1:])
            s_val = np.fromiter((v for x in output_tokens_per_sample for v in (x or ())), dtype=np.int64,
                                count=s_off[-1])
        return cls(
            arrival_s=arr,
            prompt_tokens=np.array(prompt_tokens, dtype=np.int64),
            output_tokens=np.array(output_tokens, dtype=np.int64),
            n=np.broadcast_to(np.asarray(n, dtype=np.int64), (num,)).copy(),
            beam_width=np.broadcast_to(np.asarray(beam_width, dtype=np.int64), (num,)).copy(),
            prefix_tokens=(np.zeros(num, dtype=np.int64) if prefix_tokens is None
                           else np.array(prefix_tokens, dtype=np.int64)),
            ids=None if ids is None else [str(i) for i in ids],
            prefix_group=codes, prefix_group_names=names,
            hash_offsets=offsets, hash_values=values, hash_block_size=hash_block_size,
            sample_offsets=s_off, sample_values=s_val, source=source)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def request_id(self, i: int) -> str:
        """The id of request i: the trace's own id, else its 1-based position."""
        return self.ids[i] if self.ids is not None else str(i + 1)

    def block_hashes(self, i: int) -> np.ndarray:
        """Request i's block hashes (int64, possibly empty), at `hash_block_size` tokens per block."""
        if self.hash_offsets is None:
            return np.zeros(0, dtype=np.int64)
        return self.hash_values[self.hash_offsets[i]:self.hash_offsets[i + 1]]

    def sample_lengths(self, i: int) -> list[int] | None:
        """Request i's own sample lengths (`output_tokens_per_sample`, tokens), or None when not given."""
        if self.sample_offsets is None or self.sample_offsets[i] == self.sample_offsets[i + 1]:
            return None
        return self.sample_values[self.sample_offsets[i]:self.sample_offsets[i + 1]].tolist()

    @property
    def shares_prompt_blocks(self) -> bool:
        """Whether any request may share prompt blocks (block hashes, or a prefix group); when not,
        `prompt_block_ids` is empty for every request."""
        return self.hash_offsets is not None or (self.prefix_group is not None and bool((self.prefix_group >= 0).any()))

    def prompt_block_ids(self, i: int, block_size: int) -> list[int]:
        """Content ids of request i's leading full prompt blocks of `block_size` tokens that may be shared.

        Equal ids at the same position mean identical contents; ids are deterministic across runs. From
        block hashes: used as they are when `hash_block_size` equals `block_size`, else each hashed
        block splits into hash_block_size / block_size sub-blocks (ValueError when not a multiple).
        From a prefix group: one id per full block of the shared prefix. Otherwise empty.
        """
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        num_full = int(self.prompt_tokens[i]) // block_size
        if self.hash_offsets is not None:
            hbs = self.hash_block_size or block_size
            if hbs % block_size:
                raise ValueError(f"{self.source or 'trace'}: hash block size {hbs} tokens is not a "
                                 f"multiple of block size {block_size}; use a block size dividing {hbs}, "
                                 f"or run without prefix caching (--no-enable-prefix-caching)")
            hashes = self.block_hashes(i)
            if hbs == block_size:
                return hashes[:num_full].tolist()
            return split_block_ids(hashes, hbs // block_size, num_full)
        if self.prefix_group is not None and self.prefix_group[i] >= 0:
            name = self.prefix_group_names[self.prefix_group[i]]
            return group_block_ids(name, int(self.prefix_tokens[i]) // block_size)
        return []

    def slice(self, start: int, stop: int) -> Trace:
        """Requests start..stop-1 as a new trace; arrival times and request ids are kept."""
        start, stop, _ = slice(start, stop).indices(len(self))
        stop = max(start, stop)
        ids = self.ids[start:stop] if self.ids is not None else (
            None if start == 0 else [str(k + 1) for k in range(start, stop)])
        offsets = values = None
        if self.hash_offsets is not None:
            lo, hi = self.hash_offsets[start], self.hash_offsets[stop]
            offsets, values = self.hash_offsets[start:stop + 1] - lo, self.hash_values[lo:hi].copy()
        s_off = s_val = None
        if self.sample_offsets is not None:
            lo, hi = self.sample_offsets[start], self.sample_offsets[stop]
            s_off, s_val = self.sample_offsets[start:stop + 1] - lo, self.sample_values[lo:hi].copy()
        cut = (lambda a: None if a is None else a[start:stop].copy())
        return Trace(arrival_s=cut(self.arrival_s), prompt_tokens=cut(self.prompt_tokens),
                     output_tokens=cut(self.output_tokens), n=cut(self.n), beam_width=cut(self.beam_width),
                     prefix_tokens=cut(self.prefix_tokens), ids=ids, prefix_group=cut(self.prefix_group),
                     prefix_group_names=self.prefix_group_names, hash_offsets=offsets, hash_values=values,
                     hash_block_size=self.hash_block_size, sample_offsets=s_off, sample_values=s_val,
                     source=self.source, path=self.path)

    def head(self, k: int) -> Trace:
        """The first k requests."""
        return self.slice(0, k)

    def until(self, t_s: float) -> Trace:
        """The requests arriving before `t_s` seconds."""
        return self.slice(0, int(np.searchsorted(self.arrival_s, t_s, side="left")))

    def summary(self) -> dict:
        """Counts, duration (s), rate (req/s) and token statistics (mean/p50/p90/p99/max); JSON-ready."""
        num = len(self)
        duration = float(self.arrival_s[-1] - self.arrival_s[0]) if num else 0.0
        grouped = 0 if self.prefix_group is None else int(np.count_nonzero(self.prefix_group >= 0))
        hashed = 0 if self.hash_offsets is None else int(np.count_nonzero(np.diff(self.hash_offsets)))
        return {
            "source": self.source,
            "requests": num,
            "duration_s": duration,
            "rate_rps": num / duration if duration > 0 else None,
            "prompt_tokens": _percentiles(self.prompt_tokens),
            "output_tokens": _percentiles(self.output_tokens),
            "n": {"mean": float(self.n.mean()) if num else 0.0, "max": int(self.n.max()) if num else 0},
            "beam_width": {"mean": float(self.beam_width.mean()) if num else 0.0,
                           "max": int(self.beam_width.max()) if num else 0},
            "prefix": {
                "groups": len(self.prefix_group_names),
                "requests_in_groups": grouped,
                "mean_prefix_tokens": float(self.prefix_tokens[self.prefix_tokens > 0].mean()) if grouped else 0.0,
                "requests_with_hashes": hashed,
                "hash_blocks": 0 if self.hash_values is None else len(self.hash_values),
                "unique_hash_blocks": 0 if self.hash_values is None else len(np.unique(self.hash_values)),
                "hash_block_size": self.hash_block_size,
            },
        }


def rescale_trace(trace: Trace, *, time_scale: float | None = None, rate_rps: float | None = None) -> Trace:
    """`trace` with arrival times multiplied by `time_scale`, or scaled so its mean rate (requests over
    first-to-last arrival, req/s, as `Trace.summary`) is `rate_rps`; give exactly one. Lengths, ids and
    prefixes are kept. `time_scale=0.5` doubles the rate.

    >>> t = Trace.from_arrays([0.0, 1.0, 2.0], [5, 5, 5], [3, 3, 3])
    >>> rescale_trace(t, rate_rps=3.0).arrival_s.tolist()
    [0.0, 0.5, 1.0]
    """
    from dataclasses import replace

    if (time_scale is None) == (rate_rps is None):
        raise ValueError("rescale a trace by time_scale or to rate_rps: give exactly one")
    if rate_rps is not None:
        if not rate_rps > 0:
            raise ValueError(f"rate must be > 0 requests/s, got {rate_rps}")
        rate = trace.summary()["rate_rps"]
        if rate is None:
            raise ValueError(f"{trace.source or 'trace'}: no arrival times to rescale (all requests arrive "
                             "at once); give Poisson arrivals instead (`--rate` on a lengths-only file)")
        time_scale = rate / rate_rps
    if not (time_scale > 0 and np.isfinite(time_scale)):
        raise ValueError(f"time scale must be a finite number > 0, got {time_scale}")
    return replace(trace, arrival_s=trace.arrival_s * time_scale)
