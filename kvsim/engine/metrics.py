"""Per-step and per-request records, and the run summary (keys of DESIGN.md's `--json`).

Memory columns are token slots; times are seconds. Memory fractions are time-averaged: each step's
snapshot is weighted by the step's duration. The step log buffers one tuple per step (a window's
snapshots as one table, `kvsim.alloc.base.MemoryTable`: one float64 table; as counts, a `TickRun` or
`FillRun` of kvsim/alloc/: as they are, expanded together later) and folds them, `CHUNK` rows at a time,
into numpy columns and running aggregates (all the summary needs), so a run's memory does not grow
with its steps unless rows are kept (`keep=True`: `steps.csv`, the steps table) or sent to a sink."""

from __future__ import annotations

from itertools import chain, repeat
from operator import attrgetter, itemgetter
from typing import Callable

import numpy as np

from kvsim.engine.quantiles import percentiles
from kvsim.engine.batching.request_state import FINISHED, REJECTED
from kvsim.engine.group_log import GROUP_PARTS, GROUP_PREFIX, group_breakdown as _group_breakdown
from kvsim.engine.step import LIMITS

#: `limited_by`: what held waiting requests back after the step (0 none or nothing waiting,
#: 1 kv_memory, 2 max_num_seqs, 3 token_budget); `compute_bound`: 1 when the step's kernels were.
STEP_COLUMNS = ("step", "time_s", "duration_s", "running", "waiting", "prefill_tokens", "decode_tokens",
                "used_blocks", "free_blocks", "token_states", "reserved", "internal_fragmentation",
                "external_fragmentation", "free", "unshared_blocks", "limited_by", "compute_bound")
CATEGORIES = ("token_states", "reserved", "internal_fragmentation", "external_fragmentation", "free")
# a buffered row: these columns, then the fields of the step's memory snapshot (a named tuple)
_ROW = ("time_s", "duration_s", "running", "waiting", "prefill_tokens", "decode_tokens", "limited_by",
        "compute_bound")
_WEIGHTED = CATEGORIES + ("used_blocks", "unshared_blocks")
_FLOAT = ("time_s", "duration_s")
_STARTS, _DURATIONS, _WAITING = attrgetter("starts"), attrgetter("durations"), attrgetter("waiting")
_PLAN_HEAD = attrgetter("batch_requests", "prefill_tokens", "decode_seqs", "limited_by")   # (`_ROW` 2, 4, 5, 6)
CHUNK = 1 << 16       # rows folded into the aggregates at a time
HOLD = 1 << 18        # rows buffered before folding when every row is kept and none is streamed


def _table(rows: list[tuple]) -> np.ndarray:
    """Step rows (tuples of one width) as one float64 table, the values `np.array(rows, np.float64)`
    gives, read flat by `np.fromiter`: 2.4x as fast on 8,192 rows of 18 values (timed)."""
    width = len(rows[0])
    return np.fromiter(chain.from_iterable(rows), np.float64, count=len(rows) * width).reshape(len(rows), width)


def _plan_columns(plans: list, steps: list[int], total: int) -> np.ndarray:
    """The `_ROW` columns of the steps of multi-step `plans` (`steps[j]` steps each, `total` in all) as
    one float64 table: the values `record` puts in its tuples."""
    out = np.empty((total, len(_ROW)), np.float64)
    out[:, 0] = np.fromiter(chain.from_iterable(map(_STARTS, plans)), np.float64, total)
    out[:, 1] = np.fromiter(chain.from_iterable(map(_DURATIONS, plans)), np.float64, total)
    waiting = np.fromiter(chain.from_iterable(map(_WAITING, plans)), np.float64, total)
    out[:, 3] = waiting
    heads = np.fromiter(chain.from_iterable(map(_PLAN_HEAD, plans)), np.float64, 4 * len(plans)).reshape(-1, 4)
    for col, j in ((2, 0), (4, 1), (5, 2), (6, 3)):      # (the four counts of every plan in one pass)
        out[:, col] = np.repeat(heads[:, j], steps)
    out[:, 6] *= waiting != 0
    out[:, 7] = np.fromiter(chain.from_iterable(p.compute_bound or repeat(False, k) for p, k in zip(plans, steps)),
                            np.float64, total)
    return out


class StepLog:
    """One row per engine step, appended from step plans (`record`) as one tuple per step and turned
    into numpy columns `CHUNK` rows at a time: as they come when streamed (`sink(columns)` receives
    each chunk, e.g. a CSV writer) or only aggregated (`keep=False`); else (`keep`: every row kept,
    `columns()`) once `HOLD` rows are buffered or the run has ended (the engine loop then does not
    convert rows it does not need yet)."""

    def __init__(self, keep: bool = True, sink: Callable[[dict[str, np.ndarray]], None] | None = None):
        self.keep, self.sink = keep, sink
        self._rows: list[tuple] = []      # `_ROW` values + memory fields, per step not yet folded
        self._runs: list[tuple] = []      # windows whose snapshots are counts: (first row, steps, plan, run)
        self._pending = 0                 # rows in `_rows` and `_runs` (in the order they came)
        self._parts: list[np.ndarray] = []   # earlier rows not yet folded, as float64 tables (in order)
        self._buffered = 0                # rows in `_parts` and `_rows`
        self._kept: list[dict[str, np.ndarray]] = []
        self._memory_fields: tuple[str, ...] = ()   # the snapshots' field names
        self._hold = HOLD if keep and sink is None else CHUNK   # rows buffered before folding
        self.num_steps = 0
        self.end_s = 0.0                  # when the last step ended, s
        self.total_s = 0.0                # sum of step durations, s
        self.weighted = dict.fromkeys(_WEIGHTED, 0.0)   # sum of column x duration
        self.sum_running = 0
        self.max_running = 0
        self.max_allocated = 0            # token_states + reserved + internal_fragmentation, slots
        self.limit_s = [0.0] * len(LIMITS)  # step time while requests waited, by what held them back
        self.compute_bound_s = 0.0        # step time with compute-bound kernels
        self.last: dict[str, int] = {}    # per-group snapshot fields: their value after the last step

    def record(self, plan) -> None:
        """Log the steps of `plan` (a `kvsim.engine.step.StepPlan`: one row per entry of `plan.starts`)."""
        rows, limit, waiting, memory = self._rows, plan.limited_by, plan.waiting, plan.memory
        if not self._memory_fields:
            self._memory_fields = getattr(memory, "fields", None) or memory[0]._fields
        k = len(plan.starts)
        if k == 1 and memory.__class__ is list:
            self._pending += 1
            w = waiting[0]
            rows.append((plan.starts[0], plan.durations[0], plan.batch_requests, w, plan.prefill_tokens,
                         plan.decode_seqs, limit if w else 0,
                         plan.compute_bound[0] if plan.compute_bound else False) + memory[0])
        elif hasattr(memory, "runs_table"):     # a window's snapshots as counts (`TickRun`, `FillRun`; `_flush`)
            if self._runs and self._runs[0][3].__class__ is not memory.__class__:
                self._flush()                   # (`_flush` expands runs of one kind at a time)
            self._runs.append((self._pending, k, plan, memory))
            self._pending += k
        elif hasattr(memory, "array"):          # a window's snapshots as one table (`MemoryTable`)
            self._record_table(plan, memory.array)
        else:
            self._pending += k
            limits = [limit if w else 0 for w in waiting] if limit else repeat(0, k)
            rows.extend(map(tuple.__add__, zip(
                plan.starts, plan.durations, repeat(plan.batch_requests, k), waiting,
                repeat(plan.prefill_tokens, k), repeat(plan.decode_seqs, k), limits,
                plan.compute_bound if plan.compute_bound else repeat(False, k)), memory))
        self._buffered += k
        if self._buffered >= self._hold:
            while self._buffered >= CHUNK:
                self._fold(CHUNK)

    def _record_table(self, plan, memory: np.ndarray) -> None:
        """The rows of a window whose snapshots are one int64 table, as one float64 table (the values
        the tuples would hold: every value is exact in float64)."""
        self._flush()
        k = len(plan.starts)
        table = np.empty((k, len(_ROW) + memory.shape[1]), np.float64)
        table[:, len(_ROW):] = memory
        table[:, :len(_ROW)] = _plan_columns([plan], [k], k)
        self._parts.append(table)

    def _flush(self) -> None:
        """Turn the rows recorded since the last flush (tuples and counted windows) into one float64
        table at the end of `_parts`, the windows' rows worked out together (their `runs_table`)."""
        if not self._runs:
            if self._rows:
                self._parts.append(_table(self._rows))
                self._rows, self._pending = [], 0
            return
        runs, total = self._runs, self._pending
        table = np.empty((total, len(_ROW) + len(self._memory_fields)), np.float64)
        steps = np.fromiter(map(itemgetter(1), runs), np.int64, len(runs))
        in_run = np.zeros(total + 1, np.int64)             # +1 at each window's first row, -1 after its last
        first = np.fromiter(map(itemgetter(0), runs), np.int64, len(runs))
        np.add.at(in_run, first, 1)
        np.add.at(in_run, first + steps, -1)
        in_run = in_run.cumsum()[:-1] > 0
        if self._rows:
            table[~in_run] = _table(self._rows)
        table[in_run, len(_ROW):] = runs[0][3].runs_table([run for _, _, _, run in runs])
        table[in_run, :len(_ROW)] = _plan_columns([plan for _, _, plan, _ in runs], steps, int(steps.sum()))
        self._parts.append(table)
        self._rows, self._runs, self._pending = [], [], 0

    def _take(self, rows: int) -> np.ndarray:
        """The first `rows` buffered rows as one float64 table, dropped from the buffer."""
        self._flush()
        parts, have, n = self._parts, 0, 0
        while have < rows:
            have += len(parts[n])
            n += 1
        table = parts[0] if n == 1 else np.concatenate(parts[:n])
        del parts[:n]
        if have > rows:
            parts.insert(0, table[rows:])
            table = table[:rows]
        self._buffered -= rows
        return table

    def _fold(self, rows: int | None = None) -> None:
        """Fold the first `rows` buffered rows (all by default) into the aggregates, keep them or hand
        them on, and drop them from the buffer. Chunks are always `CHUNK` rows (the last one fewer),
        so the sums are the same however the rows were recorded (one step or a window at a time)."""
        rows = self._buffered if rows is None else rows
        if not rows:
            return
        table = self._take(rows)          # (every value is exact in float64)
        chunk = {"step": np.arange(self.num_steps, self.num_steps + rows, dtype=np.int64)}
        for name in STEP_COLUMNS[1:]:
            at = _ROW.index(name) if name in _ROW else len(_ROW) + self._memory_fields.index(name)
            column = table[:, at]
            chunk[name] = column.copy() if name in _FLOAT else column.astype(np.int64)
        w = chunk["duration_s"]
        self.num_steps += rows
        self.end_s = float(chunk["time_s"][-1] + w[-1])
        self.total_s += float(w.sum())
        for name in _WEIGHTED:
            self.weighted[name] += float((chunk[name] * w).sum())
        for name in self._memory_fields:          # per-group parts of a hybrid allocator's snapshot
            if name.startswith(GROUP_PREFIX):     # (steps.csv gets them as columns too)
                at = len(_ROW) + self._memory_fields.index(name)
                self.weighted[name] = self.weighted.get(name, 0.0) + float((table[:, at] * w).sum())
                chunk[name] = table[:, at].astype(np.int64)
                self.last[name] = int(chunk[name][-1])
        for code in range(1, len(LIMITS)):
            self.limit_s[code] += float(w[chunk["limited_by"] == code].sum())
        self.compute_bound_s += float(w[chunk["compute_bound"] == 1].sum())
        self.sum_running += int(chunk["running"].sum())
        self.max_running = max(self.max_running, int(chunk["running"].max()))
        allocated = chunk["token_states"] + chunk["reserved"] + chunk["internal_fragmentation"]
        self.max_allocated = max(self.max_allocated, int(allocated.max()))
        if self.sink is not None:
            self.sink(chunk)
        if self.keep:
            self._kept.append(chunk)

    def close(self) -> None:
        """Fold the last rows (call once the run has ended)."""
        while self._buffered > CHUNK:
            self._fold(CHUNK)
        self._fold()

    def columns(self) -> dict[str, np.ndarray]:
        """Every kept row as numpy columns (`STEP_COLUMNS`, then an allocator's per-group fields
        `group<j>_<part>`, `kvsim.alloc.base.GROUP_PARTS`, when its snapshots carry them)."""
        if not self.keep:
            raise ValueError("this step log kept no rows (keep=False)")
        self.close()
        names = STEP_COLUMNS + tuple(n for n in self._memory_fields if n.startswith(GROUP_PREFIX))
        return {c: np.concatenate([k[c] for k in self._kept]) if self._kept else
                np.zeros(0, np.float64 if c in _FLOAT else np.int64) for c in names}

    def time_average(self, name: str) -> float:
        """Duration-weighted mean of column `name` over the run."""
        return self.weighted[name] / self.total_s if self.total_s else 0.0


def _quantiles(values: np.ndarray) -> dict:
    if len(values) == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    p50, p90, p99 = percentiles(values, (50, 90, 99))
    return {"p50": float(p50), "p90": float(p90), "p99": float(p99), "mean": float(values.mean())}


def summarize(requests: dict[str, np.ndarray], steps: StepLog, sched, capacity_tokens: int,
              block_size: int, num_blocks: int, sim_wall_s: float) -> dict:
    """The run summary: throughput, latency quantiles, batch sizes, preemptions, memory breakdown.
    `requests`: per-request numpy columns (`arrival_s` and the scheduler's `request_columns()`)."""
    steps.close()
    status = requests["status"]
    done = status == FINISHED
    arrival, first, finished = requests["arrival_s"][done], requests["first_token_s"][done], requests["finished_s"][done]
    output = requests["output_tokens"][done]
    duration = steps.end_s
    out_tokens = float((output * requests["n"][done]).sum())
    e2e, ttft = finished - arrival, first - arrival
    multi = output > 1
    tpot = (finished[multi] - first[multi]) / (output[multi] - 1)
    fractions = {c: steps.time_average(c) / capacity_tokens for c in CATEGORIES}
    unshared = steps.time_average("unshared_blocks")
    saved = unshared - steps.time_average("used_blocks")
    num_steps, num_done = steps.num_steps, int(done.sum())
    kv_groups = getattr(sched, "kv_groups", None)       # (a scheduler's query; test doubles may lack it)
    groups = _group_breakdown(steps, kv_groups() if kv_groups else (), capacity_tokens)
    return {
        "requests_total": int(len(status)),
        "requests_finished": num_done,
        "requests_rejected": int((status == REJECTED).sum()),
        "duration_s": duration,
        "throughput_rps": num_done / duration if duration else 0.0,
        "throughput_tokens_per_s": out_tokens / duration if duration else 0.0,
        "mean_batch_size": steps.sum_running / num_steps if num_steps else 0.0,
        "max_batch_size": steps.max_running,
        "normalized_latency_s_per_token": float((e2e / output).mean()) if num_done else None,
        "ttft_s": _quantiles(ttft), "tpot_s": _quantiles(tpot), "e2e_s": _quantiles(e2e),
        "preemptions": int(sched.num_preemptions),
        "kv": {
            "capacity_tokens": int(capacity_tokens), "block_size": int(block_size),
            "num_blocks": int(num_blocks), "mean_fraction": fractions,
            "peak_allocated_fraction": steps.max_allocated / capacity_tokens if num_steps else 0.0,
            "sharing_saved_fraction": saved / unshared if unshared > 0 else 0.0,
            **({"groups": groups} if groups else {}),
        },
        "prefix_cache_hit_tokens": int(sched.prefix_hit_tokens),
        "prefix_cache_hit_rate": (sched.prefix_hit_tokens / sched.admitted_prompt_tokens
                                  if sched.admitted_prompt_tokens else 0.0),
        "limited_by": {name: steps.limit_s[code] / steps.total_s if steps.total_s else 0.0
                       for code, name in enumerate(LIMITS) if code},
        "compute_bound_fraction": steps.compute_bound_s / steps.total_s if steps.total_s else 0.0,
        "gpu_busy_fraction": steps.total_s / duration if duration else 0.0,   # steps' time / span
        "sim_wall_s": sim_wall_s,
        "engine_steps": num_steps,
    }
