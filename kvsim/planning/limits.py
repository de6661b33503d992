"""What limited a run, in words a reader can act on: which admission limit bound the batch, or whether
the GPU itself was the bottleneck, with the figures that say so.

A run's summary carries, per admission limit, the fraction of its time that limit held waiting requests
back (`limited_by`: a full KV cache, `max_num_seqs` running sequences, the token budget
`max_num_batched_tokens`: `kvsim/engine/batching/admission.py` sets it at each step) and the fraction of its
time the GPU ran steps (`gpu_busy_fraction`: the steps' summed durations over the run's span).
`limit_of` reads them in this order:

1. an admission limit held waiting requests back for at least `MIN_HELD` of the run's time: the largest
   one bound the batch (more KV memory, a higher `max_num_seqs` or token budget would admit more);
2. otherwise, the GPU ran steps at least `BUSY` of the time: **compute** (requests were admitted as
   they came, but steps of the batch they made took all the time there was: more or faster GPUs);
3. otherwise **latency**: nothing held requests back and the GPU had idle time, so what missed the SLO
   was one request's own steps (long prefills, decode steps): a higher TP degree or a faster GPU
   shortens them; more replicas or memory do not.

The old label was "the largest `limited_by` fraction, with compute as 1 minus their sum", so a run
in which requests waited on a full cache a tenth of the time, and nothing waited for the rest, read
"compute" (issue 41: "limited by: compute" with the KV cache 100 % full).
Rows without `limited_by` (older sweeps) fall back to the memory figures: KV memory when the cache was
nearly full at its peak or under 10 % truly free on average, `max_num_seqs` when the batch reached it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

#: The admission limits, in the summary's `limited_by` order, and the two verdicts beyond them.
ADMISSION = ("kv_memory", "max_num_seqs", "token_budget")
KEYS = ADMISSION + ("compute", "latency")
#: A limit that held waiting requests back for this fraction of the run's time bound the batch: a
#: stable run below the knee has its requests admitted at once (the fraction is 0 or a few steps'
#: worth), one at or past the knee has a queue that a limit holds (the fraction climbs towards 1).
MIN_HELD = 0.02
#: The GPU was the bottleneck when it ran steps this fraction of the time or more (a saturated
#: continuous-batching engine leaves no gaps: the next step starts when the last ends).
BUSY = 0.9


@dataclass(frozen=True)
class Limit:
    """What limited a run: `key` (one of KEYS) and `text` (the key's meaning with the run's figures)."""

    key: str
    text: str


def _num(row: Mapping[str, Any], key: str) -> float | None:
    v = row.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v == v else None


def limit_of(row: Mapping[str, Any]) -> Limit:
    """The limit of one run row (`kvsim.planning.runs.summary_row` + `config_row` columns)."""
    held = {k: _num(row, f"limited_by_{k}") for k in ADMISSION}
    busy, peak = _num(row, "gpu_busy_fraction"), _num(row, "kv_peak_allocated_fraction")
    kv = f"KV peak {peak:.0%}" if peak is not None else "KV peak unknown"
    gpu = f"GPU busy {busy:.0%}" if busy is not None else "GPU busy unknown"
    if any(v is None for v in held.values()):
        return _fallback(row, kv)
    key = max(held, key=held.get)
    if held[key] >= MIN_HELD:
        what = {"kv_memory": f"a full KV cache ({kv} of {row.get('kv_capacity_tokens', '?'):,} tokens)"
                if isinstance(row.get("kv_capacity_tokens"), int) else f"a full KV cache ({kv})",
                "max_num_seqs": f"max_num_seqs = {row.get('max_num_seqs', '?')} running sequences",
                "token_budget": f"the token budget (max_num_batched_tokens = {row.get('max_batched_tokens', '?')})"}
        return Limit(key, f"{key}: {what[key]} held waiting requests back {held[key]:.0%} of the time; {gpu}")
    if busy is not None and busy >= BUSY:
        return Limit("compute", f"compute: the GPU ran steps {busy:.0%} of the time and no admission limit held "
                                f"requests back over {MIN_HELD:.0%} of it ({kv})")
    if busy is None:
        return Limit("compute", f"compute: no admission limit held requests back over {MIN_HELD:.0%} of the "
                                f"time ({kv}; {gpu})")
    return Limit("latency", f"latency: the GPU was idle {1 - busy:.0%} of the time and no admission limit held "
                            f"requests back: one request's own steps set the latency (a higher TP degree or a "
                            f"faster GPU shortens them; more replicas or KV memory do not) ({kv})")


def _fallback(row: Mapping[str, Any], kv: str) -> Limit:
    """Rows without `limited_by`: the memory figures (module docstring)."""
    free = _num(row, "kv_mean_fraction_free")
    if (_num(row, "kv_peak_allocated_fraction") or 0) >= 0.9 or (free is not None and free < 0.1):
        return Limit("kv_memory", f"kv_memory: the cache was nearly full ({kv}, "
                                  f"{'?' if free is None else f'{free:.0%}'} free on average)")
    if row.get("max_batch_size", 0) >= row.get("max_num_seqs", math.inf):
        return Limit("max_num_seqs", f"max_num_seqs: the batch reached {row.get('max_num_seqs')} sequences")
    return Limit("compute", f"compute: no memory or batch limit was reached ({kv})")
