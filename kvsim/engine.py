"""The SimPy side: an arrivals process and one engine process stepping the whole batch.

Time advances only in the engine's step timeouts (seconds of simulated GPU time from the cost model);
allocation and batching decisions are instantaneous bookkeeping in the `Scheduler`. When there is
nothing to run the engine sleeps on an event that the next arrival triggers (no polling).

Fast-forward (exact): after a step that admitted, preempted, swapped and retired nothing, the batch is
in a steady decode phase and the next steps are predictable until a request reaches its last token,
the free blocks run out, or (with an empty queue) a request arrives. The engine then runs those steps
as one window: one allocator call (`append_steps`), per-step times and log rows computed in a loop,
one timeout. Step boundaries within `_TIE` of an arrival end the window, so the order of arrivals and
steps is the same as stepping one at a time (`fast_forward=False`; tests compare the two).
"""

from __future__ import annotations

from bisect import bisect_left
from typing import Callable

import simpy

from kvsim.metrics import StepLog
from kvsim.scheduler import Scheduler, StepPlan

_TIE = 1e-9      # seconds, relative to the time: a step boundary this close to an arrival is a tie


class Engine:
    """Replays `arrival_s` through `scheduler`, timing each step with `cost` and logging it."""

    def __init__(self, arrival_s, scheduler: Scheduler, cost, log: StepLog,
                 progress: Callable[[float], None] | None = None, progress_every: int = 2000,
                 fast_forward: bool = True):
        self.arrivals = arrival_s.tolist()
        self.next_arrival = 0                       # index of the first request not yet added
        self.sched, self.cost, self.log = scheduler, cost, log
        self.progress, self.progress_every = progress, progress_every
        self.fast_forward = fast_forward
        self.windowed_steps = 0                     # steps run inside fast-forward windows
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
            self.next_arrival = i
            if not self.wakeup.triggered:
                self.wakeup.succeed()
        self.arrivals_done = True
        if not self.wakeup.triggered:
            self.wakeup.succeed()

    def _engine(self):
        env, sched, cost, log = self.env, self.sched, self.cost, self.log
        step_time, swap_time, alloc = cost.step_time, cost.swap_time, sched.alloc
        steps, report_at = 0, self.progress_every
        while True:
            preemptions, finished = sched.num_preemptions, sched.num_finished
            plan = sched.schedule(env.now)
            if plan is None:
                if self.arrivals_done and sched.done():
                    return
                self.wakeup = env.event()            # sleep until the next arrival
                yield self.wakeup
                continue
            waiting = len(sched.waiting)
            duration = step_time(plan.prefill_tokens, plan.prefill_attn_tokens,
                                 plan.decode_seqs, plan.decode_context_tokens)
            if plan.swap_tokens:
                duration += swap_time(plan.swap_tokens)
            log.record(env.now, duration, plan, waiting, alloc.stats(*sched.head_of_queue()))
            yield env.timeout(duration)
            sched.finish(plan, env.now)
            steps += 1
            steady = (self.fast_forward and not plan.prefills and not plan.swap_tokens
                      and sched.num_preemptions == preemptions and sched.num_finished == finished
                      and (waiting or not sched.waiting))   # nothing admitted, freed, or newly queued
            if steady and not waiting and self.next_arrival < len(self.arrivals):
                steady = self.arrivals[self.next_arrival] > env.now + duration   # room for 2 steps
            if steady:
                end, window = self._window(env.now)
                if window:
                    yield env.timeout(end - env.now)
                    steps += window
                    self.windowed_steps += window
            if self.progress is not None and steps >= report_at:
                self.progress(env.now)
                report_at = (steps // self.progress_every + 1) * self.progress_every

    def _window(self, now: float) -> tuple[float, int]:
        """Run the steady decode steps from `now` at once; returns (end time, steps), (now, 0) if
        fewer than two steps are predictable."""
        sched = self.sched
        steady = sched.steady_decodes()
        if steady is None:
            return now, 0
        ids, steps, context = steady
        steps = sched.alloc.decode_window(ids, steps)
        if steps < 2:
            return now, 0
        nxt, queued, num_seqs, step_time = self.next_arrival, len(sched.waiting), len(ids), self.cost.step_time
        starts, durations, waiting = [], [], []
        t = now
        for j in range(steps):
            nxt, queued = self._queue_before(t, nxt, queued)
            if nxt < 0:
                break
            starts.append(t)
            waiting.append(queued)
            durations.append(step_time(0, 0, num_seqs, context + (j + 1) * num_seqs))
            t = t + durations[-1]
        # the window's end is the next step's start: no tie with an arrival, and exactly reachable
        while starts and (now + (t - now) != t or _ties(self.arrivals, self.next_arrival, t)):
            t = starts.pop()
            durations.pop()
            waiting.pop()
        if len(starts) < 2:
            return now, 0
        k = len(starts)
        plan = StepPlan(decode_seqs=num_seqs, batch_requests=len(sched.running))
        mems = sched.alloc.append_steps(ids, k, *sched.head_of_queue())
        sched.advance(k)
        self.log.record_steps(starts, durations, plan, waiting, mems)
        return t, k


    def _queue_before(self, t: float, nxt: int, queued: int) -> tuple[int, int]:
        """Take the arrivals from index `nxt` that come before a step starting at `t` into the count of
        `queued` requests; returns (next index, queued), or (-1, queued) when the step cannot be in a
        window: an arrival ties with `t`, or would be admitted at `t` (the queue was empty)."""
        times, tie = self.arrivals, _TIE * (1 + t)
        while nxt < len(times) and times[nxt] < t + tie:
            if times[nxt] > t - tie:
                return -1, queued                  # a tie: which comes first is SimPy's to say
            if not self.sched.never_served(nxt):
                if not queued:
                    return -1, queued              # it would be admitted at this step
                queued += 1                        # it queues behind a blocked head
            nxt += 1
        return nxt, queued


def _ties(times: list[float], start: int, t: float) -> bool:
    """Whether an arrival at or after index `start` is within `_TIE` of time `t`."""
    i = bisect_left(times, t - _TIE * (1 + t), start)
    return i < len(times) and times[i] <= t + _TIE * (1 + t)
