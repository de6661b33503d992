"""The SimPy side: one engine process stepping the whole batch, pulling the trace's arrivals itself.

Time advances only in the engine's timeouts: each step's plan (`kvsim.engine.step.Stepper`: scheduling,
timing and finishing are there, shared with the GPU harness replay) says how long it lasts. Before
each step the engine queues the requests that arrived while the last one ran; when there is nothing
to run it jumps to the next arrival. Arrivals are queued in batches at the times and in the order an
arrivals process of their own would have run (`_Arrivals`), ties with step ends included.

Fast-forward (exact): after each step (and after each window, but under a stop watch) the engine asks
the stepper for a window of steady decode steps and runs it as one timeout (`fast_forward=False` steps
one at a time; tests compare the two).
"""

from __future__ import annotations

import gc
import math
from typing import Callable

import simpy

from kvsim.engine.metrics import StepLog
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import Stepper


class _Arrivals:
    """The trace's arrivals as a SimPy process of their own would queue them, without its events:
    it wakes at `at` (s), queues every request that has arrived by then (`scheduler.add(i, at)`) and
    goes back to sleep until the next arrival. Wake-ups and the engine's step ends at the same time
    run in the order they were scheduled (SimPy's order): `order` counts schedulings, and the engine
    takes the next count as the ticket of each of its timeouts (`order += 1`)."""

    def __init__(self, arrival_s: list[float], scheduler: Scheduler):
        self.times, self.sched = arrival_s, scheduler
        self.next = 0                   # index of the first request not yet queued
        self.at = 0.0                   # when it wakes next (s; inf when every request is queued)
        self.seq = 0                    # its wake-up's place in the scheduling order
        self.order = 0                  # timeouts scheduled so far (its and the engine's)
        self.wake()                     # (the process starts before the engine's)

    def wake(self) -> None:
        """Queue every request that has arrived by `at`, then sleep until the next arrival."""
        times, now, i, num = self.times, self.at, self.next, len(self.times)
        while i < num and times[i] <= now:
            self.sched.add(i, now)
            i += 1
        self.next = i
        if i < num:
            self.at = now + (times[i] - now)     # (the time a SimPy timeout of that delay fires)
            self.seq, self.order = self.order, self.order + 1
        else:
            self.at = float("inf")

    def until(self, now: float, ticket: int) -> int:
        """Run the wake-ups that come before the engine's timeout `ticket`, which fired at `now`;
        returns the index of the first request not yet queued."""
        while self.at < now or (self.at == now and self.seq < ticket):
            self.wake()
        return self.next


class Engine:
    """Replays `arrival_s` through `scheduler`, timing each step with `cost` and logging it."""

    def __init__(self, arrival_s, scheduler: Scheduler, cost, log: StepLog,
                 progress: Callable[[float], None] | None = None, progress_every: int = 2000,
                 fast_forward: bool = True, cpu_seconds=None):
        """`cpu_seconds(sequences)`: the engine profile's CPU time per step (None: none)."""
        self.arrivals = arrival_s.tolist()
        self.sched, self.log = scheduler, log
        self.stepper = Stepper(scheduler, cost, self.arrivals, cpu_seconds)
        self.progress, self.progress_every = progress, progress_every
        self.fast_forward = fast_forward
        self.env = simpy.Environment()

    def run(self) -> float:
        """Simulate until every request has finished or been rejected; returns the end time (s).
        The loop makes no reference cycles, so the cyclic garbage collector is paused while it runs
        (its scans over the run's per-request lists would cost about a sixth of the time)."""
        self.env.process(self._engine())
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
        finally:
            if collecting:
                gc.enable()
        return self.env.now

    def _engine(self):
        env, sched, stepper, log = self.env, self.sched, self.stepper, self.log
        arrivals = _Arrivals(self.arrivals, sched)
        progress, fast_forward, timeout = self.progress, self.fast_forward, env.timeout
        steps, report_at, now = 0, self.progress_every, env.now
        while True:
            plan = stepper.step(now)
            if plan is None:
                if arrivals.at == float("inf"):
                    return                          # (every request is done, or none can run)
                while env.now != arrivals.at:       # sleep until the next arrival
                    yield timeout(_delay(env.now, arrivals.at))
                arrivals.wake()
                now = env.now
                continue
            log.record(plan)
            ticket = arrivals.order             # (the timeout's ticket; `until` only when an arrival
            arrivals.order = ticket + 1         # may have come meanwhile: the per-step path)
            yield timeout(plan.durations[0])
            steps += 1
            now = env.now
            nxt = arrivals.until(now, ticket) if arrivals.at <= now else arrivals.next
            window = stepper.window(plan, now, nxt) if fast_forward else None
            while window is not None:
                log.record(window)
                ticket = arrivals.order
                arrivals.order = ticket + 1
                yield timeout(window.end_s - now)
                steps += window.num_steps
                now = env.now
                nxt = arrivals.until(now, ticket) if arrivals.at <= now else arrivals.next
                # another window may follow at once (one that ran through requests' last tokens), but
                # where a stop watch counts steps: it asks after each step and window, as it did
                window = stepper.window(window, now, nxt) if not stepper.cut_at_request_ends else None
            if progress is not None and steps >= report_at:
                progress(now)
                report_at = (steps // self.progress_every + 1) * self.progress_every


def _delay(now: float, at: float) -> float:
    """A timeout delay from `now` to `at` (> `now`): `at - now`, unless `now + (at - now)` rounds past
    `at` (then the largest delay that stays before it: from there, `at - now` reaches it exactly)."""
    delay = at - now
    while now + delay > at:
        delay = math.nextafter(delay, 0.0)
    return delay
