"""Request-level (static) batching, the FasterTransformer baseline of the vLLM paper: a batch forms
only when none runs, its prompts are padded to the longest, and every request of it is returned when
its longest one ends (finished requests stay in the batch as padding). Plain Python, no SimPy."""

from __future__ import annotations

from kvsim.engine.scheduler import Scheduler
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

    def steady_decodes(self) -> None:
        """Never: the engine steps a static batch one step at a time."""
        return None
