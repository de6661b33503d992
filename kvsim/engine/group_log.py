"""Per-KV-cache-group memory in a run's step log (an allocator with KV cache groups: hybrid, Jenga).

Such an allocator's memory snapshot carries fields `group<j>_<part>` (`kvsim.alloc.base.GROUP_PARTS`:
blocks held, token slots written / reserved / internally fragmented, blocks its window or chunk freed so
far), one j per distinct group spec in the order of `Scheduler.kv_groups()`. `kvsim.engine.metrics.StepLog`
writes them as steps.csv columns and time-averages them; `group_breakdown` turns the averages into the
summary's `kv.groups`.
"""

from __future__ import annotations

#: Field prefix, and the parts time-averaged into the summary (the cumulative `freed` is reported as its
#: last value instead).
GROUP_PREFIX = "group"
GROUP_PARTS = ("blocks", "token_states", "reserved", "internal_fragmentation")


def group_breakdown(steps, groups, capacity_tokens: int) -> list[dict]:
    """Per KV cache group (hybrid allocators): its kind (and window or chunk), mean blocks held, and the
    time-averaged token_states / reserved / internal_fragmentation as fractions of the whole pool (the
    pool's free and external fragmentation belong to no group); [] without group fields."""
    out = []
    for j, g in enumerate(groups):
        names = [f"{GROUP_PREFIX}{j}_{part}" for part in GROUP_PARTS]
        if names[0] not in steps.weighted:
            return []
        blocks, *parts = (steps.time_average(n) for n in names)
        row = {"kind": getattr(g, "kind", str(g))}
        row.update({k: v for k in ("window", "chunk") if (v := getattr(g, k, 0))})
        row.update(mean_blocks=blocks, mean_fraction={c: x / capacity_tokens for c, x in
                                                      zip(GROUP_PARTS[1:], parts)})
        freed = steps.last.get(f"{GROUP_PREFIX}{j}_freed")
        if freed is not None:          # blocks its window or chunk freed over the run
            row["freed_blocks"] = freed
        out.append(row)
    return out
