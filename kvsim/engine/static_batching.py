"""Request-level (static) batching, the FasterTransformer baseline of the vLLM paper: a batch forms
only when none runs, its prompts are padded to the longest, and every request of it is returned when
its longest one ends (finished requests stay in the batch as padding). Plain Python, no SimPy.

A running batch admits nothing until it ends, so its decode steps are predictable until one of its
requests emits its last token: `batch_window` runs them as one fast-forward window (the batch's width
stays the same, padding included; its context grows by the sequences still decoding), with the same
steps, times and memory as stepping one at a time (tests/test_fast_forward.py compares the two).
"""

from __future__ import annotations

from itertools import accumulate

from kvsim.engine.scheduler import Scheduler
from kvsim.engine.step import StepPlan, _ties


class StaticScheduler(Scheduler):
    """`Scheduler` with FasterTransformer-style batches; admission is still FCFS while memory allows."""

    def schedule(self, now: float) -> StepPlan | None:
        """Form a batch when none runs (one prefill step), else one decode step of the batch."""
        plan = StepPlan()
        if not self.running:
            self._admit(plan, 1 << 62, now)
            if not plan.prefills:
                if self.waiting:
                    self._reject(self.waiting.popleft(), now, "does not fit in the empty cache")
                    return self.schedule(now)
                return None
            longest = max(chunk for _, chunk in plan.prefills)   # prompts padded to the longest
            plan.prefill_tokens = longest * len(plan.prefills)
            plan.batch_requests = len(self.running)
            return plan
        if self.beams is not None:
            self._beam_step([i for i in self.running if self.generated[i] < self.output[i]], plan)
        for i in self.running:
            n = self.n[i]
            if self.generated[i] < self.output[i]:
                for s in self.seq_ids(i):
                    plan.copies.extend(self.alloc.append(s))
                self.kv_len[i] += 1
                plan.decodes.append(i)
            plan.decode_seqs += n               # finished requests still occupy their batch slot
            plan.decode_context_tokens += self.kv_len[i] * n
        plan.batch_requests = len(self.running)
        return plan

    def finish(self, plan: StepPlan, now: float) -> None:
        """Emit the step's tokens; retire the whole batch once its longest request is done."""
        self._emit(plan, now)
        if all(self.generated[i] >= self.output[i] for i in self.running):
            plan.finished = list(self.running)
            self._retire(plan.finished, now)

    def _batch_fits(self, i: int) -> bool:
        """A static batch never preempts, so it admits a request only while the batch's peaks, this
        request's included, fit in the cache (paged memory grows as the batch decodes; contiguous
        reservations already hold each peak, so this never binds for them)."""
        peak = self._peak_slots
        return sum(map(peak, self.running)) + peak(i) <= self.alloc.capacity_tokens

    def _end_samples(self, plan: StepPlan) -> None:
        """Never early: a sample that ended stays in the batch as padding, like a finished request."""

    def steady_decodes(self) -> None:
        """Never: a static batch's windows are `batch_window`'s (its padding is not a decode)."""
        return None

    def batch_window(self, stepper, last: StepPlan, now: float, next_arrival: int) -> StepPlan | None:
        """After step `last` ended at `now` (arrivals before index `next_arrival` queued): the running
        batch's next decode steps up to (not including) the first that emits a request's last token, as
        one plan timed by `stepper` exactly as its `step` would time each (at least two), or None. An
        arrival into an empty queue ends it (the head of the queue, which memory is judged against,
        changes); so does a step boundary tied with an arrival."""
        running, generated, output, kv_len, n = self.running, self.generated, self.output, self.kv_len, self.n
        if (not running or self.beams is not None or stepper._capped is not None
                or any(self.prefill_left[i] for i in running)):
            return None
        active = [i for i in running if generated[i] < output[i]]
        if not active:
            return None
        ids = [s for i in active for s in self.seq_ids(i)]
        steps = self.alloc.decode_window(ids, min(output[i] - generated[i] for i in active) - 1)
        if steps < 2:
            return None
        width = sum(n[i] for i in running)                 # decode_seqs: padding included
        context = sum(kv_len[i] * n[i] for i in running)   # before the next step's token
        grow = len(ids)
        step_time, cpu = stepper.cost.step_time, stepper.cpu_seconds
        cpu_s = None if cpu is None else cpu(width)
        durations = []
        for c in range(context + grow, context + grow * (steps + 1), grow):
            d = step_time(0, 0, width, c)                  # (as `Stepper.step_seconds`)
            if cpu_s is not None:
                d += cpu_s
            durations.append(d)
        ends = list(accumulate(durations, initial=now))    # ends[j] = start of step j
        k, waiting = stepper._arrivals_in(ends, steps, next_arrival, len(self.waiting))
        times = stepper.arrivals
        while k and (now + (ends[k] - now) != ends[k] or _ties(times, next_arrival, ends[k])):
            k -= 1
        if k < 2:
            return None
        memory = self.alloc.append_steps(ids, k, *self.head_of_queue())
        for i in active:
            kv_len[i] += k
            generated[i] += k
        bound = stepper._bound
        flags = ([bound(0, 0, width, context + grow * (j + 1)) for j in range(k)] if bound is not None
                 else [False] * k)
        return StepPlan(decodes=active, decode_seqs=width, decode_context_tokens=context + grow,
                        batch_requests=len(running), starts=ends[:k], durations=durations[:k],
                        waiting=waiting[:k], memory=memory, compute_bound=flags)
