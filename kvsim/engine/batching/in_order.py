"""vLLM V1's running loop taken literally (a mixin of `kvsim.engine.batching.scheduler.Scheduler`): the
running requests in their order, each its decode token or its next prefill chunk, each allocation
preempting from the back of the queue when it does not fit (vllm/v1/core/sched/scheduler.py `schedule`:
"First, schedule the RUNNING requests"). Plain Python, no SimPy. Units: tokens.

The usual kvsim step grows every decoding request first, then continues the prefill chunks; the two orders
allocate the same blocks unless a request ahead in the queue prefills while one behind it decodes and
memory is short: then vLLM allocates the prefill chunk before the later decode frees what left its
windows. That case is common with Mamba prefix caching (vLLM's "align" mode cuts each prompt's last chunk
at its last block boundary, kvsim/alloc/hybrid/mamba.py), so the scheduler runs this loop when the
allocator aligns chunks (`clip_chunk`); one sequence per request (the hybrid allocator's rule). Under
async scheduling (kvsim/engine/batching/settle.py) the loop skips a request whose last token is in flight
(vLLM: `num_computed_tokens + 2 - num_output_placeholders >= num_prompt_tokens + max_tokens`), and a request
it does not grow has no tokens in flight at the next step (the allocator's `hold_still`).
"""

from __future__ import annotations

from kvsim.engine.step import StepPlan


class InOrderRunning:
    """`_run_in_order`: the decodes and prefill chunks of the running requests, in their order."""

    def _run_in_order(self, plan: StepPlan, clip) -> tuple[int, bool]:
        """Schedule the running requests in order within the step's token budget (`clip`: the allocator's
        `clip_chunk`); returns (budget left, whether a request was preempted)."""
        alloc, running, kv_len, left = self.alloc, self.running, self.kv_len, self.prefill_left
        budget, preempted, k = self.cfg.max_batched_tokens, False, 0
        settling, hold = self.settling, getattr(self.alloc, "hold_still", None) if self.settle_lag else None
        while k < len(running) and budget > 0:
            i = running[k]
            if i in settling:
                k += 1              # (async scheduling: its last token is in flight; vLLM skips it)
                continue
            seq = self.seq_ids(i)[0]
            if left[i]:
                chunk = clip(seq, kv_len[i] - left[i], min(left[i], budget), self.prompt[i], kv_len[i],
                             self.cfg.max_batched_tokens)
                if not chunk:
                    k += 1          # (vLLM: no block-aligned chunk fits the budget; the next request goes on)
                    if hold is not None:
                        hold(seq)   # (async: none of its tokens in flight at the next step)
                    continue
            else:
                chunk = 1
            while not alloc.can_append(seq, chunk):
                victim = running[-1]             # (at or behind `i`: nothing of it planned yet)
                preempted = True
                self._preempt(victim, plan)
                if victim == i:
                    break
            if i not in running:
                break                            # (vLLM: it preempted itself; the running loop ends)
            plan.copies.extend(alloc.append(seq, chunk))
            if left[i]:
                budget -= self._prefill_chunk(i, plan, chunk)
            else:
                kv_len[i] += 1
                plan.decodes.append(i)
                plan.decode_seqs += 1
                plan.decode_context_tokens += kv_len[i]
                budget -= 1
            k += 1
        if hold is not None:        # (async: the requests the budget did not reach grow by nothing)
            for i in running[k:]:
                if i not in settling:
                    hold(self.seq_ids(i)[0])
        return budget, preempted

    def _emit(self, plan: StepPlan, now: float) -> list[int]:
        """The step's finished requests (`SchedulerBase._emit`), in batch order when the running requests
        ran in order: vLLM reports and frees them in the order it scheduled them."""
        retire = super()._emit(plan, now)
        if len(retire) > 1 and getattr(self.alloc, "clip_chunk", None) is not None:
            done = set(retire)
            retire = [i for i in self.running if i in done]
        return retire
