"""Static KV capacity, no simulation: cache size in tokens and blocks, and how many requests fit.

For each allocator — paged, and contiguous with `max`, `pow2` and `oracle` reservations — the table gives
the cache size, the maximum concurrency at the maximum model length (the figure vLLM prints at start-up:
"Maximum concurrency for 2048 tokens per request: 7.68x"), and, for a length distribution (a preset or a
trace), the mean slots one request holds at its peak and the concurrency that leaves. Contiguous
reservations are placed whole; a buddy placement rounds each one up to a power of two.

>>> df = static_capacity(model="opt-13b", gpu="a100-40gb", kv_gib=12, lengths=None)
>>> df[["allocator", "capacity_tokens", "num_blocks", "max_concurrency_at_max_len"]].values.tolist()
[['paged', 15728, 983, 7.6796875], ['contiguous-max', 15728, 15728, 7.0], ['contiguous-pow2', 15728, 15728, 7.0], ['contiguous-oracle', 15728, 15728, 7.0]]
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from kvsim.engine.config import SimConfig
from kvsim.planning.runs import capacity_tokens, make_config
from kvsim.trace.table import Trace

if TYPE_CHECKING:
    import pandas as pd

ALLOCATORS = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle")

#: Length-distribution samples drawn from a preset (enough for means within about 1 %).
NUM_SAMPLES = 10_000
#: Empty-cache fills averaged for `max_concurrency`.
TRIALS = 50


def _pow2_ceil(x: np.ndarray) -> np.ndarray:
    """Each value rounded up to a power of two (1 -> 1, 3 -> 4, 4 -> 4)."""
    return np.left_shift(1, np.frexp(np.maximum(x, 1) - 1)[1].astype(np.int64))


def reserved_slots(policy: str, prompt: np.ndarray, final: np.ndarray, max_len: int) -> np.ndarray:
    """`kvsim.alloc.contiguous.allocator.reservation` over arrays: slots reserved at admission for prompts of
    `prompt` tokens that peak at `final` slots."""
    if policy == "max":
        return np.maximum(max_len, final)
    if policy == "pow2":
        return np.minimum(prompt + _pow2_ceil(final - prompt + 1), np.maximum(max_len, final))
    return final.copy()


def fill_concurrency(cfg: SimConfig, allocator: str, prompt: np.ndarray, final: np.ndarray, max_len: int,
                     trials: int) -> float:
    """Mean over `trials` of how many requests an empty cache admits at their peak size, taken in
    order from successive points of the sample, before the first that does not fit (FCFS, no
    preemption): the concurrency the allocator's reservations and placement allow for this workload."""
    from kvsim.alloc import make_allocator

    cache, n = cfg.cache, len(prompt)
    capacity = capacity_tokens(cfg)
    kind, _, policy = allocator.partition("-")
    counts = []
    for t in range(trials):
        alloc = make_allocator(kind, capacity, block_size=cache.block_size, max_seq_len=max_len,
                               reserve=policy or "max", placement=cache.placement)
        i, admitted = (t * 7919) % n, 0
        while admitted < n:
            p, f = int(prompt[i]), int(final[i])
            need = f if kind == "paged" else p
            if not alloc.can_allocate(need, f):
                break
            alloc.allocate(admitted, need, f)
            admitted, i = admitted + 1, (i + 1) % n
        counts.append(admitted)
    return float(np.mean(counts))


def whole_extents(capacity: int, length: int, placement: str) -> int:
    """How many reservations of `length` slots fit at once: capacity // length with first fit; with a
    buddy allocator, per power-of-two arena of the capacity, arena // (length rounded up to a power of 2).

    >>> whole_extents(15728, 2048, "buddy"), whole_extents(15728, 1500, "first-fit")
    (7, 10)
    """
    if placement != "buddy":
        return capacity // length
    size = 1 << (length - 1).bit_length()
    return sum((1 << k) // size for k in range(capacity.bit_length()) if capacity >> k & 1)


def _lengths(lengths: Trace | str, max_len: int, num_samples: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) tokens of the requests that fit in `max_len`, from a trace or a preset."""
    if isinstance(lengths, Trace):
        p, m = lengths.prompt_tokens, lengths.output_tokens
    else:
        from kvsim.trace.synthetic import sample_lengths
        p, m = sample_lengths(lengths, num_samples, np.random.default_rng(seed), min(max_len, 2048))
    keep = p + m <= max_len
    if not keep.any():
        raise ValueError(f"no request of the length distribution fits the maximum model length {max_len}")
    return p[keep].astype(np.int64), m[keep].astype(np.int64)


def static_capacity(config: SimConfig | None = None, *, lengths: Trace | str | None = "sharegpt",
                    num_samples: int = NUM_SAMPLES, trials: int = TRIALS, seed: int = 0,
                    **flags: Any) -> pd.DataFrame:
    """One row per allocator (`ALLOCATORS`): `capacity_tokens`, `block_size`, `num_blocks`,
    `max_model_len`, `max_concurrency_at_max_len` (paged: blocks / blocks per max-length request, as vLLM
    prints it, by vLLM's KV cache groups for sliding / chunked / MLA / Mamba layers,
    `kvsim.engine.config.kv_cache_plan`; contiguous: whole max-length reservations that fit), and for `lengths` (a preset name, a
    Trace, or None to skip; parallel samples ignored) `mean_slots_per_request` (peak slots held or
    reserved, with placement padding), `max_concurrency` (capacity / that mean) and `ratio_to_max`.
    Configuration from `config` and/or flat run `flags` (`model`, `gpu`, `tp`, `kv_gib`, `block_size`, ...).

    >>> df = static_capacity(model="opt-13b", kv_gib=12, lengths="alpaca").set_index("allocator")
    >>> round(df.loc["paged", "ratio_to_max"]), round(df.loc["contiguous-oracle", "max_concurrency"])
    (27, 141)
    """
    import pandas as pd

    return pd.DataFrame(static_capacity_rows(config, lengths=lengths, num_samples=num_samples, trials=trials,
                                             seed=seed, **flags))


def static_capacity_rows(config: SimConfig | None = None, *, lengths: Trace | str | None = "sharegpt",
                         num_samples: int = NUM_SAMPLES, trials: int = TRIALS, seed: int = 0,
                         **flags: Any) -> list[dict]:
    """`static_capacity`'s rows, one dict per allocator with Python numbers, without pandas (for
    `kvsim capacity`, which only prints and writes them)."""
    from kvsim.engine.config import kv_cache_plan

    cfg = make_config(config, **flags)
    dep, cache = cfg.deployment, cfg.cache
    capacity = capacity_tokens(cfg)
    plan = kv_cache_plan(cfg)            # vLLM's figures for sliding / chunked / MLA / Mamba layers
    max_len = dep.model.max_seq_len           # the model's, or the `max_model_len` flag
    bs = cache.block_size
    rows = []
    sample = None if lengths is None else _lengths(lengths, max_len, num_samples, seed)
    for name in ALLOCATORS:
        if name == "paged":
            blocks = capacity // bs
            row = {"allocator": name, "capacity_tokens": blocks * bs, "block_size": bs, "num_blocks": blocks,
                   "max_model_len": max_len, "max_concurrency_at_max_len": blocks / -(-max_len // bs)}
            if plan is not None:
                row.update(capacity_tokens=plan.capacity_tokens, block_size=plan.block_size,
                           num_blocks=plan.num_blocks, max_concurrency_at_max_len=plan.max_concurrency)
        else:
            policy = name.split("-", 1)[1]
            row = {"allocator": name, "capacity_tokens": capacity, "block_size": 1, "num_blocks": capacity,
                   "max_model_len": max_len,
                   "max_concurrency_at_max_len": float(whole_extents(capacity, max_len, cache.placement))}
        if sample is not None:
            p, m = sample
            final = p + m - 1                     # the last token's KV is never written
            if name == "paged":
                slots = -(-final // bs) * bs
            else:
                slots = reserved_slots(policy, p, final, max_len)
                if cache.placement == "buddy":
                    slots = _pow2_ceil(slots)
            row["mean_slots_per_request"] = float(slots.mean())
            row["max_concurrency"] = fill_concurrency(cfg, name, p, final, max_len, trials)
        rows.append(row)
    if sample is not None:
        base = next(row["max_concurrency"] for row in rows if row["allocator"] == "contiguous-max")
        for row in rows:                          # as numpy divides: x / 0 is inf, 0 / 0 NaN
            x = row["max_concurrency"]
            row["ratio_to_max"] = x / base if base else (math.inf if x else math.nan)
    return rows
