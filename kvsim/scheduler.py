"""Iteration-level continuous batching (Orca/vLLM style) over a KV allocator. Plain Python, no SimPy.

`Scheduler.schedule(now)` decides one engine step and does its memory bookkeeping at once: decode
slots for every running sequence (preempting the most recently admitted request when a block is
missing), swap-ins, then FCFS admission of waiting requests. `Scheduler.finish(plan, now)` emits the
step's tokens and retires finished requests. Units: tokens (KV slots) and seconds.

A request with prompt P and M outputs takes one prefill (which emits its first token) and M - 1
decode steps; it holds P + g KV slots after emitting g tokens (g >= 1) and peaks at P + M - 1.
Parallel samples (`n`, and `beam_width` approximated as samples) share the prompt by `fork`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsim.alloc.base import Allocator
from kvsim.trace import Trace

if TYPE_CHECKING:
    from kvsim.config import SchedulerConfig

FINISHED, REJECTED, PENDING = "finished", "rejected", "unfinished"


@dataclass(slots=True)
class StepPlan:
    """What one engine step computes: prefill chunks, decode tokens and swap traffic (tokens)."""

    prefills: list[tuple[int, int]] = field(default_factory=list)  # (request, tokens computed)
    prefill_tokens: int = 0
    prefill_attn_tokens: int = 0      # sum of chunk x context-after-chunk
    decodes: list[int] = field(default_factory=list)                # requests decoding
    decode_seqs: int = 0
    decode_context_tokens: int = 0
    swap_tokens: int = 0              # KV slots moved over PCIe this step (either way)
    batch_requests: int = 0


class Scheduler:
    """FCFS continuous batching of a trace's requests over one allocator."""

    def __init__(self, trace: Trace, allocator: Allocator, config: SchedulerConfig,
                 max_seq_len: int, swap_tokens: int = 0, block_ids=None):
        """`swap_tokens`: CPU swap space in KV slots; `block_ids(i)`: prompt block content ids for
        prefix caching (None without)."""
        self.alloc, self.cfg, self.max_seq_len = allocator, config, max_seq_len
        self.swap_tokens = swap_tokens
        self.prompt = trace.prompt_tokens.tolist()
        self.output = trace.output_tokens.tolist()
        self.n = [max(a, b) for a, b in zip(trace.n.tolist(), trace.beam_width.tolist())]
        self.block_ids = block_ids          # callable(i) -> prompt block content ids, or None
        num = len(self.prompt)
        self.stride = max(self.n, default=1)
        self.generated = [0] * num
        self.prefill_left = [0] * num       # prompt tokens still to compute (chunked prefill)
        self.kv_len = [0] * num             # KV slots each of the request's sequences holds
        self.preemptions = [0] * num
        self.admitted_s = [float("nan")] * num
        self.first_token_s = [float("nan")] * num
        self.finished_s = [float("nan")] * num
        self.status = [PENDING] * num
        self.reason = [""] * num
        self.waiting: deque[int] = deque()
        self.swapped: deque[int] = deque()
        self.running: list[int] = []        # admission order; the last is preempted first
        self.running_seqs = 0               # sequences of the running requests
        self.swap_used = 0
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0          # cached prompt tokens at first admissions
        self.admitted_prompt_tokens = 0     # prompt tokens of requests admitted at least once
        self.num_finished = self.num_rejected = 0

    # -- arrivals -------------------------------------------------------------------------------
    def add(self, i: int, now: float) -> None:
        """Queue request `i` (arrived at `now`), or reject it if it can never be served."""
        reason = self.never_served(i)
        if reason:
            self._reject(i, now, reason)
        else:
            self.waiting.append(i)

    def never_served(self, i: int) -> str:
        """Why request `i` can never be served here (rejected on arrival), or "" when it can."""
        p, m = self.prompt[i], self.output[i]
        reason = ""
        if p + m > self.max_seq_len:
            reason = f"prompt + output = {p + m} tokens exceeds the model's maximum length {self.max_seq_len}"
        elif not self.cfg.chunked_prefill and p > self.cfg.max_batched_tokens:
            reason = f"prompt of {p} tokens exceeds max_batched_tokens {self.cfg.max_batched_tokens}"
        elif self.n[i] > self.cfg.max_num_seqs:
            reason = f"{self.n[i]} samples exceed max_num_seqs {self.cfg.max_num_seqs}"
        elif self._peak_slots(i) > self.alloc.capacity_tokens:
            reason = (f"needs {self._peak_slots(i)} KV slots at its peak, more than the whole cache "
                      f"({self.alloc.capacity_tokens})")
        return reason

    def _reject(self, i: int, now: float, reason: str) -> None:
        self.status[i], self.reason[i], self.finished_s[i] = REJECTED, reason, now
        self.num_rejected += 1

    def _peak_slots(self, i: int) -> int:
        """KV slots request `i` holds at its peak, all samples together (what the allocator shares
        counted once; contiguous: each sample's whole reservation, placement padding included)."""
        return self.alloc.peak_slots(self.prompt[i], self.prompt[i] + self.output[i] - 1, self.n[i])

    def done(self) -> bool:
        """True when nothing is waiting, running or swapped out."""
        return not (self.waiting or self.running or self.swapped)

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        """Plan the next step and allocate its memory; None when there is nothing to run."""
        plan = StepPlan()
        preempted = self._grow_running(plan)
        budget = self.cfg.max_batched_tokens - plan.decode_seqs
        budget, preempted_chunk = self._continue_prefills(plan, budget)
        preempted = preempted or preempted_chunk
        if not preempted:
            if self.swapped:
                self._swap_in(plan)
            else:
                self._admit(plan, budget, now)
        if not (plan.prefills or plan.decodes or plan.swap_tokens):
            if self.waiting and not (self.running or self.swapped):
                self._reject(self.waiting.popleft(), now, "does not fit in the empty cache")
                return self.schedule(now)
            return None
        plan.batch_requests = len(self.running)
        return plan

    def _grow_running(self, plan: StepPlan) -> bool:
        """Give each decoding sequence its next slot, preempting from the back when memory runs out.
        (The simulator's hot loop: one allocator call for the whole batch while memory lasts.)"""
        running, n, kv_len, prefill_left = self.running, self.n, self.kv_len, self.prefill_left
        decoding = [i for i in running if not prefill_left[i]]
        ids = self._decoding_seq_ids(decoding)
        preempted, done = False, 0
        while True:
            done += self.alloc.append_each(ids, done)
            if done == len(ids):
                break
            preempted = True                         # the most recently admitted request goes
            victim = running[-1]
            self._preempt(victim, plan)
            if decoding and decoding[-1] == victim:  # its sequences are the tail of `ids`
                decoding.pop()
                del ids[len(ids) - n[victim]:]
                done = min(done, len(ids))
        context = 0
        for i in decoding:
            kv = kv_len[i] = kv_len[i] + 1
            context += kv * n[i]
        plan.decodes = decoding
        plan.decode_seqs = len(ids)
        plan.decode_context_tokens = context
        return preempted

    def steady_decodes(self) -> tuple[list[int], int, int] | None:
        """When every running request is decoding under continuous batching and nothing is swapped
        out: (decoding sequence ids in `_grow_running` order, steps before a request's last token,
        context tokens held now); else None. The engine may then run steps at once (`advance`)."""
        if self.swapped or not self.running:
            return None
        running, prefill_left, generated, output = self.running, self.prefill_left, self.generated, self.output
        if any(prefill_left[i] for i in running):
            return None
        steps = min(output[i] - generated[i] for i in running) - 1
        n, kv_len = self.n, self.kv_len
        context = sum(kv_len[i] * n[i] for i in running)
        return self._decoding_seq_ids(running), steps, context

    def _decoding_seq_ids(self, decoding: list[int]) -> list[int]:
        """Sequence ids of the running requests `decoding`, in order (one per sample)."""
        stride = self.stride
        if self.running_seqs == len(self.running):   # one sequence per request
            return [i * stride for i in decoding]
        n = self.n
        return [s for i in decoding for s in range(i * stride, i * stride + n[i])]

    def advance(self, steps: int) -> None:
        """`steps` decode steps of every running request at once, none of them its last (the
        allocator's `append_steps` has grown the sequences)."""
        kv_len, generated = self.kv_len, self.generated
        for i in self.running:
            kv_len[i] += steps
            generated[i] += steps

    def _continue_prefills(self, plan: StepPlan, budget: int) -> tuple[int, bool]:
        """Next chunks of requests admitted earlier whose (chunked) prefill is unfinished; a chunk's
        blocks are taken now (single-sequence requests), preempting from the back when they do not
        fit, as vLLM's running loop does. Returns (budget left, whether a request was preempted)."""
        preempted = False
        for i in list(self.running):
            if not self.prefill_left[i] or budget <= 0 or i not in self.running:
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
                self.alloc.append(seq, chunk)
            budget -= self._prefill_chunk(i, plan, budget)
        return budget, preempted

    def _unplan(self, i: int, plan: StepPlan) -> None:
        """Take request `i`'s decode (its slot already grown) back out of this step's plan."""
        if i in plan.decodes:
            plan.decodes.remove(i)
            plan.decode_seqs -= self.n[i]
            plan.decode_context_tokens -= self.kv_len[i] * self.n[i]
            self.kv_len[i] -= 1

    def _prefill_chunk(self, i: int, plan: StepPlan, budget: int) -> int:
        chunk = min(self.prefill_left[i], budget) if self.cfg.chunked_prefill else self.prefill_left[i]
        self.prefill_left[i] -= chunk
        context = self.kv_len[i] - self.prefill_left[i]
        plan.prefills.append((i, chunk))
        plan.prefill_tokens += chunk
        plan.prefill_attn_tokens += chunk * context
        return chunk

    def _admit(self, plan: StepPlan, budget: int, now: float) -> None:
        """Strict FCFS: admit from the head while limits and memory allow; the head blocks the rest.
        Memory must hold the whole sequence (prompt, or prompt + outputs to recompute) less its
        prefix-cache hits, as vLLM's full-sequence admission check; with chunked prefill a
        single-sequence request takes only its first chunk's blocks now."""
        alloc, cfg = self.alloc, self.cfg
        while self.waiting and budget > 0:
            i = self.waiting[0]
            need = self.prompt[i] + self.generated[i]          # recompute re-prefills its outputs
            final = self.prompt[i] + self.output[i] - 1
            if self.running_seqs + self.n[i] > cfg.max_num_seqs:
                break
            seqs = self.seq_ids(i)
            ids = self.block_ids(i) if self.block_ids else ()
            if not alloc.can_allocate(need, final, ids, seqs[0]):
                break
            compute = need - alloc.cached_tokens(need, ids, seqs[0])
            if not cfg.chunked_prefill and compute > budget and (plan.prefills or plan.decodes):
                break       # (a lone prefill may exceed the budget: a recomputed request can)
            hold = need if self.n[i] > 1 or not cfg.chunked_prefill else need - compute + min(compute, budget)
            cached = alloc.allocate(seqs[0], need, final, ids, hold)
            if not self._fork_samples(seqs):
                break
            self.waiting.popleft()
            self.kv_len[i], self.prefill_left[i] = need, need - cached
            if self.admitted_s[i] != self.admitted_s[i]:  # NaN: first admission
                self.admitted_s[i] = now
                self.prefix_hit_tokens += cached
                self.admitted_prompt_tokens += self.prompt[i]
            self.running.append(i)
            self.running_seqs += self.n[i]
            budget -= self._prefill_chunk(i, plan, budget)

    def _fork_samples(self, seqs: range) -> bool:
        """Fork the request's other samples from its first sequence; undo all and return False when
        one does not fit (contiguous allocators copy the whole reservation)."""
        for k, s in enumerate(seqs[1:], start=1):
            if not self.alloc.can_fork(seqs[0]):
                for t in seqs[:k]:
                    self.alloc.free(t)
                return False
            self.alloc.fork(seqs[0], s)
        return True

    def _preempt(self, i: int, plan: StepPlan) -> None:
        """Evict request `i` (all its sequences): swap to CPU if asked and room, else recompute."""
        self.running.remove(i)   # always at or behind the request being grown: no slot taken yet
        self.running_seqs -= self.n[i]
        for s in self.seq_ids(i):
            self.alloc.free(s)
        self.preemptions[i] += 1
        self.num_preemptions += 1
        tokens = self.kv_len[i] * self.n[i]
        if (self.cfg.preemption == "swap" and not self.prefill_left[i]
                and self.swap_used + tokens <= self.swap_tokens):
            self.swap_used += tokens
            plan.swap_tokens += tokens
            self.swapped.append(i)
        else:
            self.prefill_left[i] = 0
            self.waiting.appendleft(i)

    def _swap_in(self, plan: StepPlan) -> None:
        """Bring swapped requests back FCFS while memory allows; they decode in this same step
        (each sample is restored unshared)."""
        while self.swapped:
            i = self.swapped[0]
            kv, final, seqs = self.kv_len[i], self.prompt[i] + self.output[i] - 1, self.seq_ids(i)
            restored = []
            for s in seqs:                  # each sample separately: blocks or extents do not pool
                if not self.alloc.can_allocate(kv + 1, final, (), s):
                    break
                self.alloc.allocate(s, kv + 1, final)
                restored.append(s)
            if len(restored) < len(seqs):
                for s in restored:
                    self.alloc.free(s)
                break
            self.swapped.popleft()
            self.swap_used -= kv * len(seqs)
            plan.swap_tokens += kv * len(seqs)
            self.kv_len[i] = kv + 1
            self.running.append(i)
            self.running_seqs += self.n[i]
            plan.decodes.append(i)
            plan.decode_seqs += len(seqs)
            plan.decode_context_tokens += (kv + 1) * len(seqs)

    # -- after the step -------------------------------------------------------------------------
    def finish(self, plan: StepPlan, now: float) -> None:
        """Emit the step's tokens at time `now` and retire finished requests."""
        self._retire(self._emit(plan, now), now)

    def _emit(self, plan: StepPlan, now: float) -> list[int]:
        """Count the step's tokens (first tokens stamped at `now`); returns requests now complete."""
        done = []
        for i, _ in plan.prefills:
            if self.prefill_left[i] == 0:
                done.append(i)
                if self.first_token_s[i] != self.first_token_s[i]:
                    self.first_token_s[i] = now
        done.extend(plan.decodes)
        retire = []
        for i in done:
            g = self.generated[i] = self.generated[i] + 1
            if g == self.output[i]:
                retire.append(i)
        return retire

    def _retire(self, retire: list[int], now: float) -> None:
        """Free finished requests in batch order (vLLM's order: it decides which freed blocks the
        prefix cache evicts first)."""
        if len(retire) > 1:
            done = set(retire)
            retire = [i for i in self.running if i in done]
        for i in retire:
            self.running.remove(i)
            self.running_seqs -= self.n[i]
            for s in self.seq_ids(i):
                self.alloc.free(s)
            self.status[i], self.finished_s[i] = FINISHED, now
            self.num_finished += 1

    # -- helpers --------------------------------------------------------------------------------
    def seq_ids(self, i: int) -> range:
        """Sequence ids of request `i` (one per sample), as the allocator knows them."""
        return range(i * self.stride, i * self.stride + self.n[i])

    def head_of_queue(self) -> tuple[int, int]:
        """(tokens needed now, peak tokens) of the request waiting first; (0, 0) when none."""
        if not self.waiting:
            return 0, 0
        i = self.waiting[0]
        return self.prompt[i] + self.generated[i], self.prompt[i] + self.output[i] - 1
