"""The SimPy side: an arrivals process and one engine process stepping the whole batch.

Time advances only in the engine's timeouts: each step's plan (`kvsim.step.Stepper`: scheduling,
timing and finishing are there, shared with the GPU harness replay) says how long it lasts. When there
is nothing to run the engine sleeps on an event that the next arrival triggers (no polling).

Fast-forward (exact): after each step the engine asks the stepper for a window of steady decode steps
and runs it as one timeout (`fast_forward=False` steps one at a time; tests compare the two).
"""

from __future__ import annotations

import gc
from typing import Callable

import simpy

from kvsim.metrics import StepLog
from kvsim.scheduler import Scheduler
from kvsim.step import Stepper


class Engine:
    """Replays `arrival_s` through `scheduler`, timing each step with `cost` and logging it."""

    def __init__(self, arrival_s, scheduler: Scheduler, cost, log: StepLog,
                 progress: Callable[[float], None] | None = None, progress_every: int = 2000,
                 fast_forward: bool = True, cpu_seconds=None):
        """`cpu_seconds(sequences)`: the engine profile's CPU time per step (None: none)."""
        self.arrivals = arrival_s.tolist()
        self.next_arrival = 0                       # index of the first request not yet added
        self.sched, self.log = scheduler, log
        self.stepper = Stepper(scheduler, cost, self.arrivals, cpu_seconds)
        self.progress, self.progress_every = progress, progress_every
        self.fast_forward = fast_forward
        self.env = simpy.Environment()
        self.wakeup = self.env.event()
        self.arrivals_done = False

    def run(self) -> float:
        """Simulate until every request has finished or been rejected; returns the end time (s).
        The loop makes no reference cycles, so the cyclic garbage collector is paused while it runs
        (its scans over the run's per-request lists would cost about a sixth of the time)."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        collecting = gc.isenabled()
        gc.disable()
        try:
            self.env.run()
        finally:
            if collecting:
                gc.enable()
        return self.env.now

    def _arrivals(self):
        env, sched, times = self.env, self.sched, self.arrivals
        i, num = 0, len(times)
        while i < num:
            if times[i] > env.now:
                yield env.timeout(times[i] - env.now)
            now = env.now
            while i < num and times[i] <= now:      # every request that has arrived by now
                sched.add(i, now)
                i += 1
            self.next_arrival = i
            if not self.wakeup.triggered:
                self.wakeup.succeed()
        self.arrivals_done = True
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def _engine(self):
        env, sched, stepper, log = self.env, self.sched, self.stepper, self.log
        steps, report_at = 0, self.progress_every
        while True:
            plan = stepper.step(env.now)
            if plan is None:
                if self.arrivals_done and sched.done():
                    return
                self.wakeup = env.event()            # sleep until the next arrival
                yield self.wakeup
                continue
            log.record(plan)
            yield env.timeout(plan.durations[0])
            steps += 1
            window = stepper.window(plan, env.now, self.next_arrival) if self.fast_forward else None
            if window is not None:
                log.record(window)
                yield env.timeout(window.end_s - env.now)
                steps += window.num_steps
            if self.progress is not None and steps >= report_at:
                self.progress(env.now)
                report_at = (steps // self.progress_every + 1) * self.progress_every
