"""One replica of the fleet: the engine of `kvsim.engine.loop` stepping in the fleet's SimPy
environment, with requests handed to it by the router (`dispatch`) instead of read from the trace.

Its steps are the single engine's (`kvsim.engine.step.Stepper`). Fast-forward windows cannot end at
the replica's next arrival, since where a request goes is decided only when it arrives: a window is
planned for as long as the batch stays steady (`_plan_window`) and applied to the scheduler only
when it ends, or cut when a request routed here would be admitted (the queue was empty): then the
steps that started before the arrival are applied and the replica steps again at the end of the last
of them, as the single engine would have (kvsim/engine/step.py `Stepper.window`). The router reads a
replica's load as its scheduler holds it: up to its last step's end, or its last window's start.
"""

from __future__ import annotations

from bisect import bisect_left
from itertools import accumulate

import simpy

from kvsim.engine.loop import _delay
from kvsim.engine.metrics import StepLog
from kvsim.engine.step import StepPlan, Stepper


class _Window:
    """A planned window: its sequence ids, context at its start, step starts (one more than steps: the
    last is its end), step durations, and the plan of the step before it."""

    __slots__ = ("ids", "context", "starts", "durations", "last", "queued", "arrived")

    def __init__(self, ids, context, starts, durations, last, queued):
        self.ids, self.context, self.starts, self.durations = ids, context, starts, durations
        self.last, self.queued = last, queued
        self.arrived: list[float] = []          # times of requests queued behind others meanwhile


class Replica:
    """One engine: `sched` (its allocator and prefix cache), `stepper`, `log`; `routed` lists the trace
    indices the router sent here, in order."""

    def __init__(self, env: simpy.Environment, scheduler, cost, log: StepLog, cpu_seconds=None,
                 fast_forward: bool = True):
        self.env, self.sched, self.log = env, scheduler, log
        self.stepper = Stepper(scheduler, cost, (), cpu_seconds)
        self.fast_forward = fast_forward
        self.routed: list[int] = []
        self.closed = False                 # the router has dispatched every request
        self._wake: simpy.Event | None = None     # while asleep with nothing to run
        self._window: _Window | None = None       # while a window runs (not applied yet)
        self._resume_at: float | None = None      # a cut window's end
        self.process = env.process(self._run())

    # -- what the router reads -----------------------------------------------------------------
    def outstanding(self) -> int:
        """Requests queued, running or swapped out here."""
        s = self.sched
        return len(s.waiting) + len(s.running) + len(s.swapped)

    def kv_used(self) -> int:
        """KV slots in use (cached free blocks count as free)."""
        m = self.sched.memory()
        return m.capacity_tokens - m.free

    # -- arrivals ------------------------------------------------------------------------------
    def dispatch(self, i: int, now: float) -> None:
        """Queue request `i`, which arrived at `now` (s), waking or cutting the engine when needed."""
        self.routed.append(i)
        sched, window = self.sched, self._window
        queued = len(sched.waiting)
        if window is not None and not queued and not sched.never_served(i):
            self._cut(window, now)          # it would be admitted at the next step start
        sched.add(i, now)
        if self._window is not None and len(sched.waiting) > queued:
            self._window.arrived.append(now)
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    def close(self) -> None:
        """No more requests will come: a sleeping engine ends."""
        self.closed = True
        if self._wake is not None:
            self._wake.succeed()
            self._wake = None

    # -- the engine ----------------------------------------------------------------------------
    def _run(self):
        env, stepper, log = self.env, self.stepper, self.log
        timeout, now = env.timeout, env.now
        while True:
            plan = stepper.step(now)
            if plan is None:
                if self.closed:
                    return
                self._wake = env.event()
                yield self._wake
                now = env.now
                continue
            log.record(plan)
            yield timeout(plan.durations[0])
            now = env.now
            window = self._plan_window(plan, now) if self.fast_forward else None
            if window is None:
                continue
            self._window = window
            try:
                yield timeout(window.starts[-1] - now)
                self._apply(window, len(window.durations))
                now = env.now
            except simpy.Interrupt:         # cut: the applied steps end at `_resume_at`
                at, self._resume_at = self._resume_at, None
                while env.now != at:
                    yield timeout(_delay(env.now, at))
                now = env.now

    def _plan_window(self, last: StepPlan, now: float) -> _Window | None:
        """The steady decode steps after `last` (ended at `now`), as `Stepper.window` finds them with
        no arrival known ahead; None when there are fewer than two. Nothing is applied yet."""
        sched, stepper = self.sched, self.stepper
        if (last.prefills or last.swap_tokens or last.preempted or last.finished or last.freed) \
                and (sched.waiting or sched.swapped):      # (`freed`: async scheduling's held requests)
            return None
        if stepper.async_lag and sched.deferred:      # (async scheduling: the next step admits it)
            return None
        if not last.waiting[-1] and sched.waiting:
            return None
        steady = sched.steady_decodes()
        if steady is None:
            return None
        ids, steps, context = steady
        if steps < 2:
            return None
        contexts = sched.window_contexts() if stepper._capped is not None else ()
        durations = stepper.decode_seconds(len(ids), context + len(ids), steps, contexts)
        starts = list(accumulate(durations, initial=now))
        k = steps
        while k and now + (starts[k] - now) != starts[k]:    # its end must be exactly reachable
            k -= 1
        if k < 2:
            return None
        return _Window(ids, context, starts[:k + 1], durations[:k], last, len(sched.waiting))

    def _cut(self, window: _Window, now: float) -> None:
        """A request arriving at `now` would be admitted: apply the window's steps that started
        before it and have the engine step again when the last of them ends."""
        k = bisect_left(window.starts, now, 0, len(window.durations))   # steps started before `now`
        if k:
            self._apply(window, k)
        self._window = None
        self._resume_at = window.starts[k]
        self.process.interrupt()

    def _apply(self, window: _Window, k: int) -> None:
        """Apply the window's first `k` steps to the scheduler and log them."""
        self._window = None
        sched, stepper, last = self.sched, self.stepper, window.last
        num_seqs, context = len(window.ids), window.context
        memory = sched.advance(window.ids, k)
        stepper.last_step = (window.starts[k - 1], window.starts[k])     # (the last step run: async scheduling)
        starts = window.starts[:k]
        arrived = window.arrived
        queued = window.queued
        waiting = [queued + bisect_left(arrived, t) for t in starts] if arrived else [queued] * k
        bound = stepper.decode_bound_flags(num_seqs, context, k)
        self.log.record(StepPlan(decodes=list(sched.running), decode_seqs=num_seqs,
                                 decode_context_tokens=context + num_seqs, batch_requests=len(sched.running),
                                 limited_by=last.limited_by, starts=starts, durations=window.durations[:k],
                                 waiting=waiting, memory=memory, compute_bound=bound))
