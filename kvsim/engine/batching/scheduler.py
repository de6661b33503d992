"""Iteration-level continuous batching (Orca/vLLM style) over a KV allocator. Plain Python, no SimPy.

`Scheduler.schedule(now)` decides one engine step and does its memory bookkeeping at once: decode
slots for every running sequence (preempting the most recently admitted request when a block is
missing), swap-ins, then FCFS admission of waiting requests; every allocator call it makes is written
into the returned `StepPlan`. `Scheduler.finish(plan, now)` emits the step's tokens and retires
finished requests. `kvsim.engine.step` drives the two for the engine and the harness. Preemption and
swap-in are in kvsim/engine/batching/preemption.py, admission in kvsim/engine/batching/admission.py, lazy decode steps in
kvsim/engine/batching/lazy_decode.py. Only the scheduler
calls the allocator; everyone else asks the scheduler. Units: tokens (KV slots) and seconds.

A request with prompt P and M outputs takes one prefill (which emits its first token) and M - 1
decode steps; it holds P + g KV slots after emitting g tokens (g >= 1) and peaks at P + M - 1.
Parallel samples (`n`) and beams (`beam_width`) share the prompt by `fork`; beams also die and are
replaced by forks of survivors at decode steps (`kvsim.engine.batching.beams`), so they share generated blocks too.
"""

from __future__ import annotations

from kvsim.alloc.base import MemoryStats
from kvsim.alloc.contiguous.allocator import ContiguousAllocator
from kvsim.engine.batching.admission import Admission
from kvsim.engine.batching.in_order import InOrderRunning
from kvsim.engine.batching.lazy_decode import LazyDecodes
from kvsim.engine.batching.preemption import Preemption
from kvsim.engine.batching.request_state import SchedulerBase
from kvsim.engine.batching.settle import AsyncSettle
from kvsim.engine.step import LIMITS, StepPlan

_KV = LIMITS.index("kv_memory")


def _no_lag(seq_id: int) -> None:
    """`hold_still` of an allocator whose frees do not depend on the tokens in flight."""


class Scheduler(LazyDecodes, Admission, InOrderRunning, Preemption, AsyncSettle, SchedulerBase):
    """FCFS continuous batching of a trace's requests over one allocator (decode steps of one-sequence
    requests lazily where the allocator can: kvsim/engine/batching/lazy_decode.py)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy_init()
        # swaps move one copy per block (vLLM v0's swap_blocks); contiguous memory one per sequence
        self.swap_piece_tokens = 0 if isinstance(self.alloc, ContiguousAllocator) else self.alloc.block_size

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step and allocate its memory; None when there is nothing to run. With
        `separate_prefill` (vLLM v0) a step that admits prompts runs only them; the running requests
        decode in the next step that admits none."""
        new_step = getattr(self.alloc, "new_step", None)    # (hybrid, Mamba prefix caching)
        if new_step is not None:
            new_step()
        if self.cfg.separate_prefill and self.waiting and not self.swapped:
            plan = StepPlan()
            self._admit(plan, self.cfg.max_batched_tokens, now)
            if plan.prefills:
                plan.batch_requests = len(self.running)
                return plan
            limit = plan.limited_by
            if plan.swap_tokens:                # (else nothing was planned: the plan is reused as new)
                plan = StepPlan()
        else:
            plan = StepPlan()
        clip = getattr(self.alloc, "clip_chunk", None)
        if clip is not None:                # (Mamba prefix caching: vLLM's running loop, in order)
            budget, preempted = self._run_in_order(plan, clip)
        else:
            preempted = self._grow_running(plan)
            budget = self.cfg.max_batched_tokens - plan.decode_seqs
        if self.cfg.chunked_prefill and clip is None:
            budget, preempted_chunk = self._continue_prefills(plan, budget)
            preempted = preempted or preempted_chunk
        if preempted or self.swapped:      # vLLM v0: no new prompt while any sequence is swapped out
            plan.limited_by = _KV          # (vllm/core/scheduler.py `_schedule`: `if not self.swapped:`)
            if not preempted:
                self._swap_in(plan)
        elif self.cfg.separate_prefill:
            plan.limited_by = limit if self.waiting else 0
        else:
            self._admit(plan, budget, now)
        if not (plan.prefills or plan.decodes or plan.swap_tokens):
            if self.settling or (self.settle_lag and plan.preempted):
                plan.batch_requests = len(self.running) - len(self.settling)
                return plan          # (async scheduling: vLLM queues the empty batch too; settle.py)
            # (a head deferred by async scheduling waits for the next step, not for room)
            if self.waiting and not (self.running or self.swapped or self.deferred):
                self._reject(self.waiting.popleft(), now, "does not fit in the empty cache")
                return self.schedule(now)
            return None
        plan.batch_requests = len(self.running) - len(self.settling)   # (held, finished: not in the batch)
        return plan

    def _grow_running(self, plan: StepPlan) -> bool:
        """Give each decoding sequence its next slot, preempting from the back when memory runs out.
        (The simulator's hot loop: one allocator call for the whole batch while memory lasts.)"""
        if self._lazy:
            return self._grow_lazy(plan)
        running, n, kv_len, prefill_left = self.running, self.n, self.kv_len, self.prefill_left
        if any(map(prefill_left.__getitem__, running)):   # a chunked prefill is under way
            decoding = [i for i in running if not prefill_left[i]]
        else:
            decoding = running[:]
        if self.settling:                            # (async scheduling: their last token is in flight)
            decoding = self._decoding_now(decoding)
        if self.beams is not None:
            self._beam_step(decoding, plan)
        ids = self._decoding_seq_ids(decoding)
        preempted, done = False, 0
        while True:
            done += self.alloc.append_each(ids, done, plan.copies)
            if done == len(ids):
                break
            preempted = True                         # the most recently admitted request goes
            victim = running[-1]
            self._preempt(victim, plan)
            if decoding and decoding[-1] == victim:  # its sequences are the tail of `ids`
                decoding.pop()
                del ids[len(ids) - n[victim]:]
                done = min(done, len(ids))
        for i in decoding:
            kv_len[i] += 1
        if len(ids) == len(decoding):                 # one sequence per request
            context = sum(map(kv_len.__getitem__, decoding))
        else:
            context = sum(kv_len[i] * n[i] for i in decoding)
        plan.decodes = decoding
        plan.decode_seqs = len(ids)
        plan.decode_context_tokens = context
        return preempted

    def steady_decodes(self, through_end: bool = False) -> tuple[list[int], int, int] | None:
        """When every running request is decoding under continuous batching and nothing is swapped
        out: (decoding sequence ids in `_grow_running` order, steps that can run at once before a
        request's last token or the free memory runs out, context tokens held now); else None (also while
        a request waits and the allocator frees blocks as decoding goes on: sliding windows). The
        stepper may then run up to that many steps at once (`advance`). `through_end`: the steps may
        include the one at which the first requests emit their last token (not a sample's: it frees
        the sample mid-request); `window_ends` then retires them."""
        if self.swapped or not self.running or self.beams_running() or self.settling:
            return None
        if self.waiting and getattr(self.alloc, "frees_while_decoding", False):
            return None     # a window assumes a refused head stays refused: memory must not grow back
        if self._lazy:
            return self._steady_lazy(through_end)
        running, prefill_left, generated, output = self.running, self.prefill_left, self.generated, self.output
        if any(prefill_left[i] for i in running):
            return None
        ends = self.sample_ends
        steps = min(output[i] - generated[i] for i in running) - (0 if through_end and not ends else 1)
        if ends:            # a sample's last token is a real step too (it frees the sample)
            steps = min([steps, *(ends[i][-1] - generated[i] - 1 for i in running if i in ends)])
        n, kv_len = self.n, self.kv_len
        context = sum(kv_len[i] * n[i] for i in running)
        ids = self._decoding_seq_ids(running)
        return ids, self.alloc.decode_window(ids, steps), context

    def _decoding_seq_ids(self, decoding: list[int]) -> list[int]:
        """Sequence ids of the running requests `decoding`, in order (one per sample)."""
        stride = self.stride
        if self.running_seqs == len(self.running):   # one sequence per request
            return decoding[:] if stride == 1 else [i * stride for i in decoding]
        n = self.n
        return [s for i in decoding for s in range(i * stride, i * stride + n[i])]

    def advance(self, seq_ids: list[int], steps: int) -> list[MemoryStats]:
        """`steps` decode steps of every running request at once, within what `steady_decodes` allowed
        (`seq_ids` as it returned them); the memory during each step. Requests that emitted their last
        token in the last step are still running: `window_ends` retires them."""
        if self._lazy:
            return self._advance_lazy(steps)
        mems = self.alloc.append_steps(seq_ids, steps, *self.head_of_queue())
        kv_len, generated = self.kv_len, self.generated
        for i in self.running:
            kv_len[i] += steps
            generated[i] += steps
        return mems

    def window_ends(self, now: float) -> list[int]:
        """After `advance`: retire, at `now`, the requests that emitted their last token in its last
        step (as `finish` would after that step alone); returns them in batch order."""
        if self._lazy:
            return self._window_ends_lazy(now)
        retire = [i for i in self.running if self.generated[i] == self.output[i]]
        if retire:
            self._retire(retire, now, in_order=True)
        return retire

    def _continue_prefills(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        """Next chunks of requests admitted earlier whose (chunked) prefill is unfinished; a chunk's
        blocks are taken now (single-sequence requests), preempting from the back when they do not
        fit, as vLLM's running loop does. Returns (budget left, whether a request was preempted)."""
        preempted, prefill_left = False, self.prefill_left
        # (members and async scheduling's held requests prefill nothing)
        if not self.cfg.chunked_prefill or (len(self._since) + len(self.settling) == len(self.running) if self._lazy
                                            else not any(map(prefill_left.__getitem__, self.running))):
            return budget, False        # (unchunked prefills finish in the step that admits them)
        for i in list(self.running):
            if not self.prefill_left[i] or i not in self.running:
                continue
            if budget <= 0:
                if self.settle_lag and self.n[i] == 1:    # (async: none of its tokens in flight next step)
                    getattr(self.alloc, "hold_still", _no_lag)(self.seq_ids(i)[0])
                continue
            chunk = min(self.prefill_left[i], budget)
            if self.n[i] == 1:
                seq = self.seq_ids(i)[0]
                while not self.alloc.can_append(seq, chunk):
                    victim = self.running[-1]
                    preempted = True
                    self._unplan(victim, plan)
                    self._preempt(victim, plan)
                    if victim == i:
                        break
                if i not in self.running:
                    break
                plan.copies.extend(self.alloc.append(seq, chunk))
            budget -= self._prefill_chunk(i, plan, budget)
        return budget, preempted

    def _unplan(self, i: int, plan: StepPlan) -> None:
        """Take request `i`'s decode (its slot already grown) back out of this step's plan."""
        self._leave(i)                  # (a lazy member: its state brought up to date first)
        if i in plan.decodes:
            plan.decodes.remove(i)
            plan.decode_seqs -= self.n[i]
            plan.decode_context_tokens -= self.kv_len[i] * self.n[i]
            self.kv_len[i] -= 1

    def cpu_tier_counts(self) -> dict | None:
        """The CPU tier's blocks (capacity, stored, dropped, loaded), or None without one."""
        tier = getattr(self.alloc, "cpu_tier", None)
        if tier is None:
            return None
        return {"capacity_blocks": tier.capacity_blocks, "stored_blocks": tier.stored,
                "dropped_blocks": tier.dropped, "loaded_blocks": tier.loaded}
