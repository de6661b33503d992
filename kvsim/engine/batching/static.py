"""Request-level (static) batching, the FasterTransformer baseline of the vLLM paper: a batch forms
only when none runs, its prompts are padded to the longest, and every request of it is returned when
its longest one ends (finished requests stay in the batch as padding). Plain Python, no SimPy.

A running batch admits nothing until it ends, so its decode steps are predictable until one of its
requests emits its last token: `batch_window` runs them as one fast-forward window (the batch's width
stays the same, padding included; its context grows by the sequences still decoding), with the same
steps, times and memory as stepping one at a time (tests/engine/batching/test_fast_forward.py compares the two).
"""

from __future__ import annotations

from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import StepPlan


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

    def steady_decodes(self, through_end: bool = False) -> None:
        """Never: a static batch's windows are `batch_window`'s (its padding is not a decode)."""
        return None

    def batch_window(self, stepper, last: StepPlan, now: float, next_arrival: int) -> StepPlan | None:
        """After step `last` ended at `now` (arrivals before index `next_arrival` queued): the running
        batch's next decode steps up to (not including) its last one (which retires it), through the
        steps at which its shorter requests emit their last tokens (they stay in the batch as padding:
        its context then grows by fewer sequences), as one plan timed by `stepper` exactly as its
        `step` would time each (at least two), or None. An arrival into an empty queue ends it (the
        head of the queue, which memory is judged against, changes); so does a step boundary tied
        with an arrival. With `stepper.cut_at_request_ends` (a stop watch counts steps), it ends
        before the first step that emits a request's last token."""
        running, generated, output, kv_len, n = self.running, self.generated, self.output, self.kv_len, self.n
        if (not running or self.beams is not None or stepper._capped is not None
                or any(self.prefill_left[i] for i in running)):
            return None
        active = [i for i in running if generated[i] < output[i]]
        if not active:
            return None
        left = [output[i] - generated[i] for i in active]   # steps each still decodes in
        first = min(left)
        limit = first - 1 if stepper.cut_at_request_ends else max(left) - 1   # (the last step retires it)
        ids = [s for i in active for s in self.seq_ids(i)]
        steps = self.alloc.decode_window(ids, min(first, limit))
        if steps < 2:
            return None
        width = sum(n[i] for i in running)                 # decode_seqs: padding included
        context = sum(kv_len[i] * n[i] for i in running)   # before the next step's token
        if steps == first and first < limit:
            steps = limit      # on through request ends (memory holds every peak: `_batch_fits`)
        times = stepper.arrivals
        if not self.waiting and next_arrival < len(times):
            # an arrival ends the window and steps only lengthen (as `Stepper.window`): none starting
            # after the first's duration x this many can be in it
            d = stepper.decode_seconds(width, context + len(ids), 1)[0]
            if d > 0:
                steps = min(steps, int((times[next_arrival] - now) / d) + 2)
        # segments of steps with the same requests decoding: [start, end) of the window's steps
        ends_at = sorted({x for x in left if x < steps} | {steps})
        segments, start, c = [], 0, context
        for end in ends_at:
            grow = sum(n[i] for i, x in zip(active, left) if x > start)
            segments.append((start, end, grow, c + grow))  # (.., context of its first step)
            c += grow * (end - start)
            start = end
        durations = []
        for start, end, grow, c in segments:
            durations += stepper.decode_seconds(width, c, end - start, growth=grow)
        k, ends, waiting = stepper.window_cut(durations, now, next_arrival, len(self.waiting))
        if k < 2:
            return None
        head, parts = self.head_of_queue(), []
        for start, end, grow, c in segments:
            if start >= k:
                break
            seg = [s for i, x in zip(active, left) if x > start for s in self.seq_ids(i)]
            num = min(end, k) - start
            if start and self.alloc.decode_window(seg, num) < num:
                raise RuntimeError("a static batch ran out of memory it was admitted with")
            parts.append(self.alloc.append_steps(seg, num, *head))
        for i, x in zip(active, left):
            grown = min(x, k)
            kv_len[i] += grown
            generated[i] += grown
        return StepPlan(decodes=active, decode_seqs=width, decode_context_tokens=context + len(ids),
                        batch_requests=len(running), starts=ends[:k], durations=durations[:k],
                        waiting=waiting[:k], memory=_joined(parts),
                        compute_bound=_flags(stepper._bound, width, segments, k))


def _context(segments: list[tuple[int, int, int, int]], j: int) -> int:
    """The context tokens step `j` of a window of `segments` reads."""
    for start, end, grow, c in segments:
        if j < end:
            return c + grow * (j - start)
    raise IndexError(j)


def _flags(bound, width: int, segments: list[tuple[int, int, int, int]], k: int) -> list[bool]:
    """Whether each of the window's first `k` steps is compute-bound (all False when the cost model does
    not say). More context only adds memory traffic, so the flag turns off at most once: found by
    bisection from the first and last steps' flags."""
    if bound is None:
        return [False] * k
    first, last = (bound(0, 0, width, _context(segments, j)) for j in (0, k - 1))
    if first == last:
        return [first] * k
    lo, hi = 0, k - 1                   # bound at lo, not at hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if bound(0, 0, width, _context(segments, mid)):
            lo = mid
        else:
            hi = mid
    return [True] * hi + [False] * (k - hi)


def _joined(parts: list):
    """One window's memory snapshots from its segments' (one allocator's: all lists of named tuples, or
    all runs, e.g. `kvsim.alloc.contiguous.fill_runs.FillRun`, then expanded together as one table: `concat`)."""
    if len(parts) == 1:
        return parts[0]
    if parts[0].__class__ is list:
        return [row for p in parts for row in p]
    return parts[0].concat(parts)
