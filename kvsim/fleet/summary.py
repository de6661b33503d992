"""Fleet records: each replica's usual summary (`kvsim.engine.metrics.summarize` over the requests it
served and its own steps), the fleet's summary over every request and every replica's steps, and the
imbalance between replicas.

The fleet summary's memory fractions are the replicas' time-weighted means against one replica's
capacity (`kv.capacity_tokens` is a replica's; `fleet.capacity_tokens` the whole fleet's); its
prefix-cache hit rate is hit tokens over admitted prompt tokens of all replicas together; its
duration runs to the last replica's last step. With one replica it is that replica's summary, exactly
the single engine's (`kvsim.engine.sim.simulate`).
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kvsim.engine.metrics import CATEGORIES, summarize
from kvsim.engine.sim import cpu_tier_summary


class FleetLog:
    """The replicas' step logs added up, read as one `StepLog` by `summarize` (sums of step time and of
    time-weighted columns, the latest end, the largest batch and allocation)."""

    def __init__(self, logs):
        for log in logs:
            log.close()
        self.num_steps = sum(log.num_steps for log in logs)
        self.end_s = max(log.end_s for log in logs)
        self.total_s = sum(log.total_s for log in logs)
        names = dict.fromkeys(name for log in logs for name in log.weighted)
        self.weighted = {name: sum(log.weighted.get(name, 0.0) for log in logs) for name in names}
        self.sum_running = sum(log.sum_running for log in logs)
        self.max_running = max(log.max_running for log in logs)
        self.max_allocated = max(log.max_allocated for log in logs)
        self.limit_s = [sum(parts) for parts in zip(*(log.limit_s for log in logs))]
        self.compute_bound_s = sum(log.compute_bound_s for log in logs)

    def close(self) -> None:
        """(The replicas' logs are closed already.)"""

    def time_average(self, name: str) -> float:
        return self.weighted[name] / self.total_s if self.total_s else 0.0


def engine_extras(summary: dict, scheds, steppers, kv_bytes_per_token: int, cfg, block_size: int) -> None:
    """The keys `simulate` adds after `summarize` (swap traffic, recomputed tokens, beams), summed
    over `scheds` (and their `steppers`)."""
    summary["engine_profile"] = cfg.resolved().engine_profile.name
    summary["swap"] = {"swap_outs": sum(s.num_swap_outs for s in scheds),
                       "swap_ins": sum(s.num_swap_ins for s in scheds),
                       "bytes": sum(s.swapped_tokens for s in scheds) * kv_bytes_per_token,
                       "time_s": sum(st.swap_s for st in steppers),
                       "fallbacks_to_recompute": sum(s.swap_fallbacks for s in scheds)}
    summary["recomputed_tokens"] = sum(s.recomputed_tokens for s in scheds)
    tiers = [getattr(s, "cpu_tier_counts", lambda: None)() for s in scheds]
    if tiers[0] is not None:
        summary["cpu_kv"] = cpu_tier_summary(tiers, scheds, kv_bytes_per_token, block_size)
    summary["beam"] = {"death_rate": cfg.scheduler.beam_death_rate, "forks": sum(s.beam_forks for s in scheds),
                       "copied_slots": sum(s.beam_copied_slots for s in scheds)}


def merged_columns(base: dict[str, np.ndarray], replicas, columns: list[dict]) -> dict[str, np.ndarray]:
    """Per-request columns over the whole trace, each request's row from the replica that served it
    (`columns[r]`: replica r's scheduler's columns), plus `replica` (its index)."""
    out = dict(base)
    which = np.zeros(len(base["id"]), np.int64)
    for r, (rep, cols) in enumerate(zip(replicas, columns)):
        rows = np.asarray(rep.routed, np.int64)
        if r == 0:
            out.update({name: col.copy() for name, col in cols.items()})
        else:
            for name, col in cols.items():
                out[name][rows] = col[rows]
        which[rows] = r
    out["replica"] = which
    return out


def replica_summary(base: dict[str, np.ndarray], rep, columns: dict, capacity: int, block_size: int, wall: float,
                    kv_bytes_per_token: int, cfg) -> dict:
    """The usual summary of one replica, over the requests routed to it (`columns`: its scheduler's)."""
    rows = np.asarray(rep.routed, np.int64)
    cols = {name: col[rows] for name, col in {**base, **columns}.items()}
    summary = summarize(cols, rep.log, rep.sched, capacity, block_size, capacity // block_size, wall)
    engine_extras(summary, [rep.sched], [rep.stepper], kv_bytes_per_token, cfg, block_size)
    return summary


def fleet_summary(columns: dict[str, np.ndarray], replicas, capacity: int, block_size: int, wall: float,
                  kv_bytes_per_token: int, cfg) -> dict:
    """The summary of the whole fleet (module docstring), without the `fleet` section."""
    scheds = [rep.sched for rep in replicas]
    counts = SimpleNamespace(num_preemptions=sum(s.num_preemptions for s in scheds),
                             prefix_hit_tokens=sum(s.prefix_hit_tokens for s in scheds),
                             admitted_prompt_tokens=sum(s.admitted_prompt_tokens for s in scheds),
                             kv_groups=scheds[0].kv_groups)
    summary = summarize(columns, FleetLog([rep.log for rep in replicas]), counts, capacity, block_size,
                        capacity // block_size, wall)
    engine_extras(summary, scheds, [rep.stepper for rep in replicas], kv_bytes_per_token, cfg, block_size)
    return summary


def imbalance(per_replica: list[dict]) -> dict:
    """Max over mean, across replicas, of requests served and of KV memory in use (time-averaged
    token states + reserved + internal fragmentation); 1.0 is perfect balance."""
    def ratio(values):
        mean = sum(values) / len(values)
        return max(values) / mean if mean else 1.0
    used = [sum(s["kv"]["mean_fraction"][c] for c in CATEGORIES if c not in ("free", "external_fragmentation"))
            for s in per_replica]
    return {"requests_max_over_mean": ratio([s["requests_total"] for s in per_replica]),
            "kv_used_max_over_mean": ratio(used)}
