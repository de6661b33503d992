"""The SimPy side: an arrivals process and one engine process stepping the whole batch.

Time advances only in the engine's step timeouts (seconds of simulated GPU time from the cost model);
allocation and batching decisions are instantaneous bookkeeping in the `Scheduler`. When there is
nothing to run the engine sleeps on an event that the next arrival triggers (no polling).
"""

from __future__ import annotations

from typing import Callable

import simpy

from kvsim.metrics import StepLog
from kvsim.scheduler import Scheduler


class Engine:
    """Replays `arrival_s` through `scheduler`, timing each step with `cost` and logging it."""

    def __init__(self, arrival_s, scheduler: Scheduler, cost, log: StepLog,
                 progress: Callable[[float], None] | None = None, progress_every: int = 2000):
        self.arrivals = arrival_s.tolist()
        self.sched, self.cost, self.log = scheduler, cost, log
        self.progress, self.progress_every = progress, progress_every
        self.env = simpy.Environment()
        self.wakeup = self.env.event()
        self.arrivals_done = False

    def run(self) -> float:
        """Simulate until every request has finished or been rejected; returns the end time (s)."""
        self.env.process(self._arrivals())
        self.env.process(self._engine())
        self.env.run()
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
            if not self.wakeup.triggered:
                self.wakeup.succeed()
        self.arrivals_done = True
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def _engine(self):
        env, sched, cost, log = self.env, self.sched, self.cost, self.log
        step_time, swap_time, alloc = cost.step_time, cost.swap_time, sched.alloc
        steps = 0
        while True:
            plan = sched.schedule(env.now)
            if plan is None:
                if self.arrivals_done and sched.done():
                    return
                self.wakeup = env.event()            # sleep until the next arrival
                yield self.wakeup
                continue
            duration = step_time(plan.prefill_tokens, plan.prefill_attn_tokens,
                                 plan.decode_seqs, plan.decode_context_tokens)
            if plan.swap_tokens:
                duration += swap_time(plan.swap_tokens)
            log.record(env.now, duration, plan, len(sched.waiting), alloc.stats(*sched.head_of_queue()))
            yield env.timeout(duration)
            sched.finish(plan, env.now)
            steps += 1
            if self.progress is not None and steps % self.progress_every == 0:
                self.progress(env.now)
