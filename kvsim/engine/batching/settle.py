"""vLLM 0.33's async scheduling as the scheduler sees it: one batch always in flight, so each step is
planned before the previous one's outputs are known. A mixin of `kvsim.engine.batching.scheduler.Scheduler`.
Plain Python, no SimPy.

vLLM (`EngineCore.step_with_batch_queue` with two batches in its queue, `AsyncScheduler`) schedules step
N + 1 while step N runs and processes N's outputs (`Scheduler.update_from_output`) only after N + 1 is
scheduled. What changes, each taken from vllm/v1/core/sched/scheduler.py:
- a request whose last token step N samples stays in `running` through step N + 1's scheduling: it is
  skipped there (`num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens + max_tokens`),
  still holds its blocks, counts against `max_num_seqs` and can be the preemption victim (then its blocks
  go at once and it is recorded preempted; its in-flight output finishes it); otherwise it is freed when
  N's outputs arrive, after N + 1 is planned (`settling` here: freed at the start of `finish(N + 1)`);
- sliding-window and chunked groups free only out of the tokens whose batch completed
  (`allocate_slots`: `total_computed_tokens - request.num_in_flight_tokens`; the hybrid allocator's
  `async_lag`, kvsim/alloc/hybrid/windows.py `_processed`), so a request running prefill chunks that got
  no budget in a step is told so (`hold_still`);
- a step may plan no tokens at all (all running requests settling, the queue head not fitting until they
  go): vLLM still schedules and queues that empty batch, and so does kvsim (an empty plan; it takes no
  time, `kvsim.engine.step.Stepper`).
Decoding, prefill chunks and admission are otherwise as with synchronous scheduling (decodes use
`num_output_placeholders`, one token a step). Finish times stay the step that samples the last token.
Lazy decode ticks (kvsim/engine/batching/lazy_decode.py) go on where the allocator can stop a finished
sequence's ticks while it is held (`tick_leave`: the paged allocator; not the hybrid one, whose window
frees lag the tokens in flight); fast-forward windows never run across a settling request.
"""

from __future__ import annotations

from kvsim.engine.batching.request_state import FINISHED
from kvsim.engine.step_plan import StepPlan


#: Up to this many requests are put in batch order by their indices in `running` (`_batch_order`).
_FEW = 16


class AsyncSettle:
    """`settle_lag` (off: synchronous scheduling), `use_async_scheduling`, and the settle bookkeeping the
    scheduler calls (`_settle`, `_mark_finished`, `_preempt_settling`, `_decoding_now`)."""

    settle_lag = False
    settling: dict = {}                 # request -> None: finished, still held
    _settle_ordered = True              # whether `settling` is in batch order

    def use_async_scheduling(self) -> None:
        """Plan every step with the previous one in flight (vLLM's async scheduling). Call before the
        first step. Lazy decode ticks stay on only where the allocator can stop a held request's ticks
        (`tick_leave`) and its frees do not lag the tokens in flight (`async_lag`)."""
        self.settle_lag = True
        self.settling = {}
        if not hasattr(self.alloc, "tick_leave") or hasattr(self.alloc, "async_lag"):
            self._lazy = False
        if hasattr(self.alloc, "async_lag"):
            self.alloc.async_lag = True

    def finish(self, plan: StepPlan, now: float) -> None:
        if self.settle_lag:          # (the step before's finished requests are freed first)
            self._settle(plan)
        super().finish(plan, now)

    def _retire(self, retire: list[int], now: float, in_order: bool = False) -> None:
        if self.settle_lag:
            return self._mark_finished(retire, now)
        super()._retire(retire, now, in_order)

    def _decoding_now(self, decoding: list[int]) -> list[int]:
        """`decoding` less the requests that are settling (their last token is in flight)."""
        settling = self.settling
        return [i for i in decoding if i not in settling] if settling else decoding

    def _settle(self, plan: StepPlan) -> None:
        """Free the requests that finished in the step before `plan`'s (their outputs have arrived), in
        batch order, unless a preemption took them already."""
        settling = self.settling
        if not settling:
            return
        known = getattr(self.alloc, "register_known", None)
        # (one `_mark_finished` filled it in batch order, and the batch keeps its order: no sort needed)
        for i in list(settling) if self._settle_ordered else self._batch_order(settling):
            if known is not None:        # (its outputs arrived: its last blocks are cached, then freed)
                for s in self.seq_ids(i):
                    known(s)
            self.running.remove(i)
            self.running_seqs -= self.n[i]
            self._finished_blocks(i)
            plan.freed.extend(self.seq_ids(i))
        self.settling = {}

    def _mark_finished(self, retire: list[int], now: float) -> None:
        """Async scheduling's `_retire`: finished at `now` (counted, stamped), held until `_settle`."""
        if len(retire) > 1:          # (put in batch order, in place: `plan.finished`, as vLLM reports them)
            retire[:] = self._batch_order(retire)
        self._settle_ordered = not self.settling     # (else two calls' requests may interleave)
        for i in retire:
            self.status[i], self.finished_s[i] = FINISHED, now
            self.num_finished += 1
            self.settling[i] = None

    def _batch_order(self, ids) -> list[int]:
        """Requests `ids` (all in `running`, each once) in batch order: by their places in `running`
        where they are few (each found by a scan in C), else by one pass over the batch."""
        running = self.running
        if len(ids) == 1:
            return list(ids)
        if len(ids) <= _FEW:
            return sorted(ids, key=running.index)
        ids = set(ids)
        return [i for i in running if i in ids]

    def _preempt_settling(self, i: int, plan: StepPlan) -> None:
        """Preempt settling request `i` (the last of `running`): its blocks go now and it counts as
        preempted, as in vLLM; its in-flight output then finishes it, so it is not queued again."""
        self.running.remove(i)
        self.running_seqs -= self.n[i]
        del self.settling[i]
        for s in self.seq_ids(i):
            self.alloc.free(s)
            plan.freed.append(s)
        self.preemptions[i] += 1
        self.num_preemptions += 1
        plan.preempted.append(i)
