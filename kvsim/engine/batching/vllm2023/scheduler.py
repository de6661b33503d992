"""vLLM 0.1.4's scheduling policy (vllm/core/scheduler.py `Scheduler._schedule` and the block manager's
checks, August 2023: the engine of the PagedAttention paper) over kvsim's paged allocator. Plain Python,
no SimPy. Checked step for step against vLLM 0.1.4's own code run on CPU (tests/vllm/test_vllm2023_oracle.py).

Each step, in 0.1.4's order:
1. Prompt step, only while nothing is swapped out: from the head of the queue, admit whole groups while
   the free blocks minus the prompt's blocks stay >= the watermark (`can_allocate`: 1% of the blocks,
   `WATERMARK`), the prompts' tokens stay <= max_num_batched_tokens and the running sequences plus the
   group's stay <= max_num_seqs; a head longer than min(max_model_len, max_num_batched_tokens) tokens
   (a recomputed request counts its outputs too) is dropped as ignored and ends the admission. A step
   that admitted anything runs only those prompts.
2. Else a decode step: the running groups sorted by arrival; each in turn needs one free block per
   running sequence (`can_append_slot`, whether or not its next token opens a block), else the latest
   arrival is preempted (itself when it is the last): recompute for one sequence, swap for several
   (or `--preemption swap`); then its slots are taken (copy-on-write of a shared last block).
3. Swap-in, unless this step swapped something out: swapped groups sorted by arrival, earliest first,
   while free - (the group's distinct blocks + one per sequence) >= the watermark (`can_swap_in`) and
   max_num_seqs allows; a group's shared blocks move once each way and stay shared
   (`kvsim.alloc.paged.block_manager_v0`).
Beams fork after the step that emitted their token (0.1.4 `Scheduler.update`), not before the next.

Where kvsim goes on where vLLM 0.1.4 stops: out of swap space vLLM aborts the engine, kvsim recomputes
the request (counted as a swap fallback); a swapped group that cannot come back into an idle engine
(vLLM waits forever) is recomputed. Units: tokens, blocks, seconds.
"""

from __future__ import annotations

from kvsim.alloc.paged import block_manager_v0 as bm
from kvsim.engine.batching.scheduler import Scheduler
from kvsim.engine.step import LIMITS, StepPlan

_KV, _SEQS, _BUDGET = (LIMITS.index(name) for name in ("kv_memory", "max_num_seqs", "token_budget"))

#: `BlockSpaceManager(watermark=0.01)`: admission and swap-in leave int(1% of the GPU blocks) free
#: (vllm/core/block_manager.py, 0.1.4).
WATERMARK = 0.01


class SchedulerV0(Scheduler):
    """`Scheduler` with vLLM 0.1.4's policy (module docstring); paged memory without a prefix cache."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy = False                  # (its own decode loop: no lazy members)
        self.watermark_blocks = int(WATERMARK * self.alloc.num_blocks)
        self.prompt_limit = min(self.max_seq_len, self.cfg.max_batched_tokens)
        self._images: dict[int, bm.SwapImage] = {}
        self._reforks: list[tuple[int, int]] = []   # beam forks made after the last step
        self._untried = False               # the last step dropped its head: the next one is untried
        self._ended = False                 # the last step ended samples (freed blocks, sequences)
        self.ignored = 0                    # prompts dropped as too long (rejected)

    def _never_served(self, i: int, p: int, m: int) -> str:
        if p > self.prompt_limit:
            return ""                       # (dropped when it reaches the head of the queue, as vLLM)
        return super()._never_served(i, p, m)

    # -- one step ---------------------------------------------------------------------------------
    def schedule(self, now: float) -> StepPlan | None:
        plan = StepPlan()
        plan.reforked, self._reforks = self._reforks, []
        self._untried, limit = False, 0
        if self.waiting and not self.swapped:
            limit = self._admit_v0(plan, now)
            if plan.prefills:
                plan.limited_by = limit if self.waiting else 0
                plan.batch_requests = len(self.running)
                return plan
        self._decode_v0(plan)
        if not plan.swapped_out:
            self._swap_in_v0(plan)
        if self.swapped:
            limit = _KV
        plan.limited_by = limit if self.waiting else 0
        if not (plan.decodes or plan.swap_tokens or plan.preempted):
            if self.waiting and not (self.running or self.swapped) and not self._untried:
                self._reject(self.waiting.popleft(), now, "does not fit in the empty cache")
                return self.schedule(now)
            return self.schedule(now) if self._untried and self.waiting else None
        plan.batch_requests = len(self.running)
        return plan

    def _admit_v0(self, plan: StepPlan, now: float) -> int:
        """The prompt step's admissions (module docstring, 1); returns what stopped them (LIMITS)."""
        alloc, cfg, waiting = self.alloc, self.cfg, self.waiting
        prompt, generated, output, n = self.prompt, self.generated, self.output, self.n
        batched, bs = 0, self.alloc.block_size
        while waiting:
            i = waiting[0]
            tokens = prompt[i] + generated[i]
            if tokens > self.prompt_limit:
                waiting.popleft()
                self._reject(i, now, f"prompt of {tokens} tokens exceeds min(max_model_len, "
                                     f"max_num_batched_tokens) = {self.prompt_limit} (vLLM 0.1.x: ignored)")
                self.ignored += 1
                self._untried = True
                return _BUDGET
            if alloc.num_free_blocks - -(-tokens // bs) < self.watermark_blocks:
                return _KV
            if batched + tokens > cfg.max_batched_tokens:
                return _BUDGET
            if self.running_seqs + n[i] > cfg.max_num_seqs:
                return _SEQS
            seqs = self.seq_ids(i)
            many = len(seqs) > 1
            own = generated[i] if many else 0        # (kvsim's recompute of several samples)
            alloc.allocate(seqs[0], tokens - own, prompt[i] + output[i] - 1)
            if many:
                self._fork_samples(seqs)
                if own and not self._regrow(seqs, own):     # (undone: every sample freed again)
                    return _KV
                plan.forked.extend((seqs[0], s) for s in seqs[1:])
            plan.allocated.append((seqs[0], 0))
            waiting.popleft()
            self.kv_len[i], self.prefill_left[i] = tokens, tokens - own + own * len(seqs)
            if self.admitted_s[i] != self.admitted_s[i]:     # NaN: first admission
                self.admitted_s[i] = now
                self.admitted_prompt_tokens += prompt[i]
            self.running.append(i)
            self.running_seqs += n[i]
            batched += tokens
            self._prefill_chunk(i, plan, tokens)
        return 0

    def _decode_v0(self, plan: StepPlan) -> None:
        """The decode step's slots (module docstring, 2)."""
        alloc, running, n, kv_len = self.alloc, self.running, self.n, self.kv_len
        running.sort()                           # trace order is arrival order
        j, passed, stride = 0, 0, self.stride   # groups done, their sequences
        while j < len(running):
            if alloc.num_free_blocks >= self.running_seqs - passed:
                # every check left passes: a sequence takes at most one block a step (a new one or a
                # copy), so before each group at least its own sequences' blocks are still free
                alloc.append_each(self._decoding_seq_ids(running[j:]) if j else self._decoding_seq_ids(running),
                                  0, plan.copies)
                break
            i = running[j]
            while alloc.num_free_blocks < n[i]:
                victim = running[-1]
                self._preempt(victim, plan)
                if victim == i:
                    break
            else:
                if n[i] == 1:
                    plan.copies.extend(alloc.append(i * stride))
                else:
                    for s in self.seq_ids(i):
                        plan.copies.extend(alloc.append(s))
                passed += n[i]
                j += 1
        for i in running:
            kv_len[i] += 1
        plan.decodes = running[:]
        plan.decode_seqs = self.running_seqs
        plan.decode_context_tokens = sum(kv_len[i] * n[i] for i in running)

    def _preempt(self, i: int, plan: StepPlan) -> None:
        """Evict request `i`: one sequence by recompute, several (or --preemption swap) by swap of its
        distinct blocks; recompute too when the swap space is full (vLLM 0.1.4 aborts there)."""
        seqs = self.seq_ids(i)
        if not (self.cfg.preemption == "swap" or len(seqs) > 1):
            return super()._preempt(i, plan)
        image = bm.swap_out(self.alloc, seqs)
        self.running.remove(i)
        self.running_seqs -= self.n[i]
        self.preemptions[i] += 1
        self.num_preemptions += 1
        plan.preempted.append(i)
        plan.freed.extend(seqs)
        tokens = image.blocks * self.alloc.block_size
        if self.prefill_left[i] or self.swap_used + tokens > self.swap_tokens:
            self.swap_fallbacks += 1
            plan.swap_fallbacks += 1
            self._to_recompute(i, plan)
            return
        self._images[i] = image
        self.swap_used += tokens
        plan.swap_tokens += tokens
        plan.swap_blocks += image.blocks
        plan.swapped_out.append(i)
        self.swapped.append(i)
        self.num_swap_outs += 1
        self.swapped_tokens += tokens

    def _swap_in_v0(self, plan: StepPlan) -> None:
        """Swapped requests back, earliest arrival first (module docstring, 3); each decodes now."""
        alloc, swapped = self.alloc, self.swapped
        order = sorted(swapped)
        swapped.clear()
        swapped.extend(order)
        while swapped:
            i = swapped[0]
            image, seqs = self._images[i], self.seq_ids(i)
            if alloc.num_free_blocks - (image.blocks + len(seqs)) < self.watermark_blocks \
                    or self.running_seqs + len(seqs) > self.cfg.max_num_seqs:
                if self.running or plan.decodes:
                    break
                swapped.popleft()                # (an idle engine it can never come back into)
                del self._images[i]
                self.swap_used -= image.blocks * alloc.block_size
                self.swap_fallbacks += 1
                plan.swap_fallbacks += 1
                self._to_recompute(i, plan)
                continue
            swapped.popleft()
            del self._images[i]
            bm.swap_in(alloc, seqs, image)
            tokens = image.blocks * alloc.block_size
            self.swap_used -= tokens
            plan.swap_tokens += tokens
            plan.swap_blocks += image.blocks
            plan.allocated.extend((s, 0) for s in seqs)
            plan.swapped_in.append(i)
            self.num_swap_ins += 1
            self.swapped_tokens += tokens
            for s in seqs:
                plan.copies.extend(alloc.append(s))
            self.kv_len[i] += 1
            self.running.append(i)
            self.running_seqs += len(seqs)
            plan.decodes.append(i)
            plan.decode_seqs += len(seqs)
            plan.decode_context_tokens += self.kv_len[i] * len(seqs)

    # -- after the step ----------------------------------------------------------------------------
    def finish(self, plan: StepPlan, now: float) -> None:
        """`Scheduler.finish`, then the beams of the step's requests fork (0.1.4 `Scheduler.update`)."""
        super().finish(plan, now)
        self._ended = bool(plan.samples_ended)
        if self.beams is None:
            return
        beam, generated, stride = self.beam, self.generated, self.stride
        for i in plan.decodes:
            if beam[i] > 1 and 2 <= generated[i] < self.output[i]:
                for parent, child in self.beams.replacements(i, self.n[i]):
                    self.alloc.refork(i * stride + parent, i * stride + child)
                    self._reforks.append((i * stride + parent, i * stride + child))
                    self.beam_forks += 1

    def steady_decodes(self, through_end: bool = False):
        """`Scheduler.steady_decodes`, cut where a step could start with fewer free blocks than running
        sequences (vLLM would preempt there), never right after a dropped head or a sample's end."""
        if self._untried or self._ended:     # (a sample's end frees blocks and a sequence: admission may pass)
            return None
        steady = super().steady_decodes(through_end)
        if steady is None:
            return None
        ids, steps, context = steady
        return ids, min(steps, bm.reserve_window(self.alloc, ids, steps)), context
