"""One engine step as a plan, shared by the SimPy engine and the GPU harness replay. SimPy-free.

`Stepper.step(now)` asks the scheduler for the next step (which does its memory bookkeeping), times
it, and finishes it (emits tokens, retires finished requests), returning a `StepPlan`: who runs with
how many prefill and decode tokens, every allocator call (sequences given memory, forks, copy-on-write
block pairs, sequences freed, dead beams replaced by forks of survivors: `reforked`, made before the
step's writes), swaps out and in, preemptions, finishes, the queue length, the memory
while the step runs, its start and duration; the engine turns it into a timeout and a log row, the
harness into kernel inputs (`gpu_harness.layout`), like vLLM's scheduler output with `blocks_to_copy`.

`Stepper.window(last, now, next_arrival)` is the exact fast-forward: after a step that admitted,
preempted, swapped and retired nothing, or after any step that left nothing queued or swapped out,
the batch is in a steady decode phase and the next steps are predictable through the step at which a
request emits its last token (retired at the window's end; under a stop watch, up to the step before),
until the free blocks run out, or (with an empty queue) a request arrives; another window may follow.
It returns those steps as one plan (one entry per step in `starts`, `durations`, `waiting`, `memory`). Step boundaries within `TIE` of an arrival end the window, so the order of
arrivals and steps is the same as stepping one at a time (tests compare the two).

Timing lives in one place, `Stepper.step_seconds` (`_timed_step`, which also gives the step's
compute-bound flag) / `Stepper.decode_seconds`: the cost model's kernel time, plus PCIe time for swaps,
plus the engine profile's CPU time (`cpu_seconds(sequences)`, with sequences = decoding sequences +
prefilling requests). Seconds throughout.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate
from typing import Sequence

from kvsim.engine.step_plan import MemoryRecord, StepPlan  # noqa: F401 (re-exported)

TIE = 1e-9      # seconds, relative to the time: a step boundary this close to an arrival is a tie


#: What held waiting requests back after a step (`StepPlan.limited_by`, the summary's `limited_by`).
LIMITS = ("", "kv_memory", "max_num_seqs", "token_budget")
#: The limits that hold the head of the queue back until memory is freed or a request ends.
_BLOCKED = (LIMITS.index("kv_memory"), LIMITS.index("max_num_seqs"))


class Stepper:
    """Advances `scheduler` one step (or one fast-forward window) at a time, timed with `cost`
    (`step_time(prefill_tokens, prefill_attn_tokens, decode_seqs, decode_context_tokens)` and
    `swap_time(tokens, pieces)`, seconds; optionally `compute_bound(...)` with the same arguments, both at
    once as `timed_step(...)`, and a window's steps as `decode_step_times(seqs, first_context, steps,
    growth, plus_s)`, `plus_s` added to each) plus
    `cpu_seconds(sequences)` (an engine profile's CPU time; None: none). `arrival_s` (sorted) is
    needed only for windows. `swap_s` adds up the PCIe time of the steps so far."""

    def __init__(self, scheduler, cost, arrival_s: Sequence[float] = (), cpu_seconds=None):
        self.sched, self.cost = scheduler, cost
        self.arrivals = list(arrival_s)
        self.cpu_seconds = cpu_seconds
        self.swap_s = 0.0
        # static batching's windows end before each step at which a request emits its last token, as they
        # once did, where a watch asks every so many steps (`simulate`'s `stop_when`): else a window runs
        # through them and the watch would look at other times (`StaticScheduler.batch_window`)
        self.cut_at_request_ends = False
        self._bound = getattr(cost, "compute_bound", None)
        self._timed = getattr(cost, "timed_step", None)        # (both at once: the roofline's)
        # sliding / chunked layers are priced from each sequence's own context (kvsim.cost.layer_kinds)
        self._capped = getattr(cost, "capped", None) or None
        if self._capped is not None:
            scheduler.track_capped_reads(self._capped.groups)
        # async scheduling (vLLM V1): the step starting when the previous one ends was scheduled when
        # that one started, so it admits only requests that had arrived by then (`Admission.admit_cutoff`)
        self.async_lag = getattr(scheduler, "async_lag", False)
        self.last_step = (float("-inf"), float("-inf"))      # (start, end) of the last step run

    # -- timing: the one place a step's duration is computed -------------------------------------
    def step_seconds(self, plan: StepPlan) -> float:
        """Duration of the step `plan` describes: kernels, plus PCIe time for its swap traffic, plus the
        engine profile's CPU time."""
        return self._timed_step(plan)[0]

    def _timed_step(self, plan: StepPlan) -> tuple[float, bool]:
        """(`step_seconds(plan)`, whether its kernels are compute-bound: False for cost models that do not
        say), asking the cost model once where it answers both (`timed_step`)."""
        args = plan.prefill_tokens, plan.prefill_attn_tokens, plan.decode_seqs, plan.decode_context_tokens
        if self._timed is not None:
            duration, bound = self._timed(*args)
        else:
            duration, bound = self.cost.step_time(*args), self._bound(*args) if self._bound is not None else False
        if self._capped is not None:
            duration += self._capped.time_reads(*self.sched.step_reads(plan))
        if plan.swap_tokens:
            swap = self.cost.swap_time(plan.swap_tokens, plan.swap_blocks)
            self.swap_s += swap
            duration += swap
        if self.cpu_seconds is not None:
            duration += self.cpu_seconds(plan.decode_seqs + len(plan.prefills))
        return duration, bound

    def decode_seconds(self, num_seqs: int, first_context: int, steps: int,
                       contexts: Sequence[tuple[int, int]] = (), growth: int | None = None) -> list[float]:
        """Durations of `steps` decode-only steps of `num_seqs` sequences reading `first_context`
        context tokens in the first and `growth` (default `num_seqs`) more in each next one (a window):
        the same as `step_seconds` of each such step (kernels, then the profile's CPU time), computed
        at once when the cost model can. `contexts`: (context, sequences) per request at the first
        step, for a cost model that prices sliding or chunked layers per sequence."""
        grow = num_seqs if growth is None else growth
        at_once = getattr(self.cost, "decode_step_times", None)
        capped = self._capped is not None and contexts
        # the CPU time is added to each step last; where nothing comes between, the cost model adds it
        # (adding 0.0 leaves a positive float's bits as they are)
        cpu = self.cpu_seconds(num_seqs) if self.cpu_seconds is not None else 0.0
        plus = 0.0 if capped else cpu
        if at_once is not None:
            durations = at_once(num_seqs, first_context, steps, growth, plus)
        else:
            step_time = self.cost.step_time
            durations = [step_time(0, 0, num_seqs, first_context + j * grow) + plus for j in range(steps)]
        if capped:
            windows = self._capped.window_times(contexts, steps).tolist()
            durations = [d + c + cpu for d, c in zip(durations, windows)]
        return durations

    def decode_bound_flags(self, num_seqs: int, context: int, steps: int) -> list[bool]:
        """Whether each of `steps` decode steps of `num_seqs` sequences holding `context` tokens before
        the first (each step reads `num_seqs` more) has compute-bound kernels (a window's flags)."""
        at_first = self._compute_bound(num_seqs, context + num_seqs)
        at_last = self._compute_bound(num_seqs, context + steps * num_seqs)
        if at_first == at_last:   # more context only adds memory traffic: the flag changes at most once
            return [at_first] * steps
        return [self._compute_bound(num_seqs, context + j * num_seqs) for j in range(1, steps + 1)]

    def _compute_bound(self, num_seqs: int, context: int) -> bool:
        """Whether the kernels of a decode step of `num_seqs` sequences reading `context` tokens are
        compute-bound; False for cost models that do not say."""
        if self._timed is not None and num_seqs > 0:
            return self._timed(0, 0, num_seqs, context)[1]
        return self._bound(0, 0, num_seqs, context) if self._bound is not None else False

    # -- one step -----------------------------------------------------------------------------
    def step(self, now: float, tables: bool = False) -> StepPlan | None:
        """Schedule, time and finish the step that starts at `now`; None when nothing can run.
        `tables`: also copy every live sequence's block table into the plan (paged; the harness), and
        its tables per KV cache group (`group_tables`: the hybrid allocator's; else one group)."""
        sched = self.sched
        if self.async_lag:
            start, end = self.last_step
            sched.admit_cutoff = start if abs(end - now) <= TIE * max(1.0, abs(now)) else now
            sched.deferred = False
        plan = sched.schedule(now)
        if plan is None and self.async_lag and sched.deferred:
            # the step scheduled ahead was empty (nothing ran): the engine schedules again now, and
            # sees what arrived meanwhile
            sched.admit_cutoff, sched.deferred = now, False
            plan = sched.schedule(now)
        if plan is None:
            return None
        plan.waiting.append(len(sched.waiting))
        plan.memory.append(sched.memory())
        if tables:
            plan.tables = sched.block_tables()
            plan.group_tables = sched.block_tables(groups=True)
        if plan.prefills or plan.decodes or plan.swap_tokens:
            duration, bound = self._timed_step(plan)
        else:       # (async scheduling's empty batch while finished requests settle: nothing runs)
            duration, bound = 0.0, False
        plan.starts.append(now)
        plan.durations.append(duration)
        plan.compute_bound.append(bound)
        sched.finish(plan, now + duration)
        self.last_step = (now, now + duration)
        return plan

    # -- many steps at once -------------------------------------------------------------------
    def window(self, last: StepPlan, now: float, next_arrival: int) -> StepPlan | None:
        """After step `last` ended at `now`, with arrivals before index `next_arrival` queued: the
        next steady decode steps as one plan (at least two), or None."""
        sched, times = self.sched, self.arrivals
        own = getattr(sched, "batch_window", None)      # static batching's windows (its own rules)
        if own is not None:
            return own(self, last, now, next_arrival)
        if self.async_lag and sched.deferred:
            return None      # a request deferred by async scheduling is admitted by the next step
        # (`freed`: async scheduling freed the requests that finished the step before: settle.py)
        if (last.prefills or last.swap_tokens or last.preempted or last.finished or last.freed) \
                and (sched.waiting or sched.swapped) \
                and not self._after_blocked_prefill(last):
            return None      # the next step may admit or swap in (else it only decodes: steady)
        if not last.waiting[-1] and (sched.waiting or (next_arrival < len(times)
                                                       and times[next_arrival] <= now + last.durations[-1])):
            return None      # something arrived (or arrives within a step) and would be admitted
        # through the step at which requests emit their last token (retired at the window's end), but
        # where a stop watch counts steps: there windows end before it, as they did (its counts stay put)
        steady = sched.steady_decodes(through_end=not self.cut_at_request_ends)
        if steady is None:
            return None
        ids, steps, context = steady
        if steps < 2:
            return None
        num_seqs = len(ids)
        contexts = sched.window_contexts() if self._capped is not None else ()
        if not sched.waiting and next_arrival < len(times):
            # the next arrival ends the window (it would be admitted); steps only lengthen, so none
            # starting after the first's duration x this many can be in it (a bound only: the
            # arrivals below cut the window exactly; the full-context part of the first step suffices)
            first = self.decode_seconds(num_seqs, context + num_seqs, 1)[0]
            if first > 0:
                steps = min(steps, int((times[next_arrival] - now) / first) + 2)
        durations = self.decode_seconds(num_seqs, context + num_seqs, steps, contexts)
        k, ends, waiting = self.window_cut(durations, now, next_arrival, len(sched.waiting))
        if k < 2:
            return None
        running = list(sched.running)
        memory = sched.advance(ids, k)
        finished = sched.window_ends(ends[k])
        bound = self.decode_bound_flags(num_seqs, context, k)
        plan = StepPlan()            # (its fields set directly: fewer steps than by name)
        (plan.decodes, plan.decode_seqs, plan.decode_context_tokens, plan.batch_requests, plan.limited_by,
         plan.starts, plan.durations, plan.waiting, plan.memory, plan.compute_bound, plan.finished) = (
            running, num_seqs, context + num_seqs, len(running), last.limited_by, ends[:k], durations[:k],
            waiting[:k], memory, bound, finished)
        self.last_step = (plan.starts[-1], plan.end_s)
        return plan

    def _after_blocked_prefill(self, last: StepPlan) -> bool:
        """Whether `last` was a prompt-only step (vLLM v0's separate prefill) whose admission stopped at
        KV memory or the sequence limit, and that retired, preempted and swapped nothing: then the next
        step's admission fails the same way (the same head of the queue, memory and running count;
        decode steps only shrink memory) and it only decodes, so a window may start there. Not under
        a stop watch (`cut_at_request_ends`): it asks every so many engine iterations, which must stay put."""
        return (not (last.decodes or last.swap_tokens or last.preempted or last.finished or self.sched.swapped
                     or self.cut_at_request_ends)
                and last.limited_by in _BLOCKED and self.sched.cfg.separate_prefill)

    def window_cut(self, durations: list[float], now: float, next_arrival: int,
                   queued: int) -> tuple[int, list[float], list[int]]:
        """How many of the steps of `durations` (s), the first starting at `now`, can run as one window
        given `queued` requests queued and arrivals from index `next_arrival` on (`_arrivals_in`), with
        each step's start (`ends[j]`: the start of step j) and the queue length at it."""
        ends = list(accumulate(durations, initial=now))
        k, waiting = self._arrivals_in(ends, len(durations), next_arrival, queued)
        # the window's end is the next step's start: no tie with an arrival, and exactly reachable
        times = self.arrivals
        while k and (now + (ends[k] - now) != ends[k] or _ties(times, next_arrival, ends[k])):
            k -= 1
        return k, ends, waiting

    def _arrivals_in(self, starts: list[float], steps: int, nxt: int, queued: int) -> tuple[int, list[int]]:
        """How many of the `steps` steps starting at `starts` can be in a window, and the queue length
        at each start, given `queued` requests queued now and arrivals from index `nxt` on. An arrival
        counts at the first step that starts after it (within `TIE`, it ties: the window ends before
        that step); one that would be admitted there (the queue was empty) ends the window too."""
        times, never_served = self.arrivals, self.sched.never_served
        added = [0] * (steps + 1)            # arrivals queued just before each step
        k, j = steps, 0
        while nxt < len(times):
            ta = times[nxt]
            j = max(j, bisect_left(starts, ta - 2 * TIE * (1 + ta), j, steps))
            while j < steps and not ta < starts[j] + TIE * (1 + starts[j]):
                j += 1
            if j == steps:
                break
            if ta > starts[j] - TIE * (1 + starts[j]) or (not queued and not never_served(nxt)):
                k = j                        # a tie, or admitted at step j: the window stops before
                break
            if not never_served(nxt):
                queued += 1
                added[j] += 1
            nxt += 1
        base = queued - sum(added)
        return k, [base + x for x in accumulate(added[:k])]


def _ties(times: list[float], start: int, t: float) -> bool:
    """Whether an arrival at or after index `start` is within `TIE` of time `t`."""
    i = bisect_left(times, t - TIE * (1 + t), start)
    return i < len(times) and times[i] <= t + TIE * (1 + t)
