"""One simulation: build the run from its configuration, drive it with the SimPy engine, and return
the records. The command line and the Python API both come through `simulate`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Callable

import numpy as np

from kvsim.engine.config import SimConfig
from kvsim.engine.build import build_run
from kvsim.engine.loop import Engine
from kvsim.engine.metrics import StepLog, summarize
from kvsim.trace.table import Trace

if TYPE_CHECKING:
    import pandas as pd


class SimResult:
    """The summary dict (DESIGN.md keys) and the per-request and per-step records: numpy columns
    (`request_columns`, `step_columns`), or pandas tables built on first use (`requests`, `steps`)."""

    def __init__(self, summary: dict, request_columns: dict[str, np.ndarray], log: StepLog):
        self.summary, self.request_columns, self._log = summary, request_columns, log
        self._requests: pd.DataFrame | None = None
        self._steps: pd.DataFrame | None = None

    @property
    def step_columns(self) -> dict[str, np.ndarray]:
        """One array per `kvsim.engine.metrics.STEP_COLUMNS` entry (raises when the run kept no steps)."""
        return self._log.columns()

    @property
    def requests(self) -> pd.DataFrame:
        """One row per request: times in seconds from trace start, status finished|rejected|unfinished."""
        if self._requests is None:
            import pandas as pd
            self._requests = pd.DataFrame(self.request_columns)
        return self._requests

    @property
    def steps(self) -> pd.DataFrame:
        """One row per engine step (`kvsim.engine.metrics.STEP_COLUMNS`)."""
        if self._steps is None:
            import pandas as pd
            self._steps = pd.DataFrame(self.step_columns)
        return self._steps


#: Engine steps between two `stop_when` questions: a watch that looks at each request once (the rate
#: search's `SloWatch`) costs little per question, and a run that has missed its SLO stops within this
#: many steps of it (at 2,000, the progress default, an overloaded 600-s Alpaca run went on for a
#: fifth of its span after its verdict was certain; `bench/rate_search_cost.py`).
STOP_CHECK_EVERY = 200


class _Stopped(Exception):
    """Raised through the engine's progress hook when `stop_when` says the run may stop."""


def simulate(trace: Trace, cfg: SimConfig, progress: Callable[[float], None] | None = None,
             cost=None, fast_forward: bool = True, keep_steps: bool = True, step_sink=None,
             stop_when: Callable[[object, float], bool] | None = None) -> SimResult:
    """Run `trace` through the configured deployment; deterministic for a given trace and config.
    `cost` replaces the configured cost model (golden tests pass a `ConstantCost`);
    `fast_forward=False` steps one at a time (the same results, slower; see kvsim/engine/step.py);
    `keep_steps=False` keeps no per-step rows (memory bounded by the requests, not the steps);
    `step_sink(columns)` receives the step rows in chunks as they come (e.g. to stream steps.csv);
    `stop_when(scheduler, now)`, asked every `STOP_CHECK_EVERY` steps, ends the run early when True (the
    rate search's verdict on a run that has already missed its SLO): the summary then covers the
    requests so far and says when it stopped (`stopped_early_s`)."""
    parts = build_run(trace, cfg)
    log = StepLog(keep=keep_steps, sink=step_sink)
    start = time.perf_counter()
    profile = parts.profile
    hook = progress
    if stop_when is not None:
        def hook(now: float) -> None:
            if progress is not None:
                progress(now)
            if stop_when(parts.scheduler, now):
                raise _Stopped(now)
    engine = Engine(trace.arrival_s, parts.scheduler, cost or parts.cost, log, hook,
                    progress_every=STOP_CHECK_EVERY if stop_when is not None else 2000,
                    fast_forward=fast_forward,   # (a profile without CPU time adds 0.0: skipped)
                    cpu_seconds=profile.cpu_seconds if profile.cpu_step_s or profile.cpu_seq_s else None)
    engine.stepper.cut_at_request_ends = stop_when is not None   # (the watch's step counts stay put)
    stopped = None
    try:
        engine.run()
    except _Stopped as stop:
        stopped = stop.args[0]
    wall = time.perf_counter() - start
    columns = {"id": _ids(trace), "arrival_s": np.asarray(trace.arrival_s),
               **parts.scheduler.request_columns()}
    summary = summarize(columns, log, parts.scheduler, parts.capacity_tokens, parts.block_size,
                        parts.capacity_tokens // parts.block_size, wall)
    sched = parts.scheduler
    summary["engine_profile"] = profile.name
    summary["swap"] = {"swap_outs": sched.num_swap_outs, "swap_ins": sched.num_swap_ins,
                       "bytes": sched.swapped_tokens * cfg.deployment.kv_bytes_per_token(),
                       "time_s": engine.stepper.swap_s, "fallbacks_to_recompute": sched.swap_fallbacks}
    summary["recomputed_tokens"] = sched.recomputed_tokens
    if stopped is not None:
        summary["stopped_early_s"] = stopped
    tier = getattr(sched, "cpu_tier_counts", lambda: None)()
    if tier is not None:
        summary["cpu_kv"] = cpu_tier_summary([tier], [sched], cfg.deployment.kv_bytes_per_token(), parts.block_size)
    summary["beam"] = {"death_rate": cfg.scheduler.beam_death_rate, "forks": sched.beam_forks,
                       "copied_slots": sched.beam_copied_slots}
    return SimResult(summary, columns, log)


def cpu_tier_summary(tiers: list[dict], scheds, kv_bytes_per_token: int, block_size: int) -> dict:
    """The CPU tier's figures over one or more engines: blocks (capacity per engine, stored, dropped,
    loaded), bytes loaded over PCIe, and the prefix hit rate per tier (hit tokens at first admissions
    over admitted prompt tokens: `gpu_hit_rate` + `cpu_hit_rate` = `prefix_cache_hit_rate`)."""
    admitted = sum(s.admitted_prompt_tokens for s in scheds)
    cpu = sum(s.cpu_hit_tokens for s in scheds)
    gpu = sum(s.prefix_hit_tokens for s in scheds) - cpu
    out = {k: sum(t[k] for t in tiers) for k in ("stored_blocks", "dropped_blocks", "loaded_blocks")}
    return {"capacity_blocks": tiers[0]["capacity_blocks"], **out,
            "loaded_bytes": out["loaded_blocks"] * block_size * kv_bytes_per_token,
            "stored_bytes": out["stored_blocks"] * block_size * kv_bytes_per_token,
            "gpu_hit_rate": gpu / admitted if admitted else 0.0, "cpu_hit_rate": cpu / admitted if admitted else 0.0}


def _ids(trace: Trace) -> np.ndarray:
    """Request ids as strings (the trace's own, else the line number): `trace.request_id(i)` of each,
    made at once (a call per request cost a third as much as summarizing a 108,000-request run)."""
    ids = np.empty(len(trace), dtype=object)
    ids[:] = trace.ids if trace.ids is not None else list(map(str, range(1, len(trace) + 1)))
    return ids
