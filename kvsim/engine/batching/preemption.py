"""Preemption and swapping for continuous batching: evicting a request when a block is missing
(swap to CPU memory, else recompute) and bringing swapped requests back FCFS. Plain Python, no SimPy;
a mixin of `kvsim.engine.batching.scheduler.Scheduler`. Units: KV slots.
"""

from __future__ import annotations

from kvsim.engine.step import StepPlan


class Preemption:
    """`_preempt` and `_swap_in` of `Scheduler`. `swap_piece_tokens`: tokens per contiguous piece a swap
    moves (the block size for paged memory, 0 for contiguous memory: one piece per sequence)."""

    swap_piece_tokens: int = 0

    def _swap_pieces(self, tokens: int) -> int:
        """Contiguous copies that move one sequence of `tokens` KV slots (vLLM v0: one per block)."""
        b = self.swap_piece_tokens
        return -(-tokens // b) if b else 1

    def _preempt(self, i: int, plan: StepPlan) -> None:
        """Evict request `i` (all its sequences): swap to CPU if asked, room, and it can come back
        (`_swap_in` restores each sample unshared: all of them at their peak must fit the whole
        cache), else recompute (which shares the prompt again). A request settling under async
        scheduling (kvsim/engine/batching/settle.py) is finished: its blocks go, it is not queued again."""
        if i in self.settling:
            return self._preempt_settling(i, plan)
        self._leave(i)
        running = self.running   # (i is always at or behind the request being grown: no slot taken yet)
        if running[-1] == i:
            running.pop()        # (the usual victim, the last: no search from the front)
        else:
            running.remove(i)
        self.running_seqs -= self.n[i]
        if self.stride == 1:     # (one sequence, numbered as its request)
            self.alloc.free(i)
            plan.freed.append(i)
        else:
            seqs = self.seq_ids(i)
            for s in seqs:
                self.alloc.free(s)
            plan.freed.extend(seqs)
        self.preemptions[i] += 1
        self.num_preemptions += 1
        plan.preempted.append(i)
        cfg = self.cfg
        if cfg.preemption == "swap" or (cfg.swap_multi_seq and self.n[i] > 1):
            self._swap_out(i, plan)
        else:
            self._to_recompute(i, plan)

    def _swap_out(self, i: int, plan: StepPlan) -> None:
        """Move preempted request `i`'s KV to CPU memory when it can come back whole and the swap space
        holds it (counted as a swap-out), else recompute it (a fallback when only the space is short)."""
        tokens = self.kv_len[i] * self.n[i]
        final = self.prompt[i] + self.output[i] - 1
        swap = self.n[i] * self.alloc.peak_slots(final, final) <= self.alloc.capacity_tokens
        if swap and not self.prefill_left[i] and self.swap_used + tokens <= self.swap_tokens:
            self.swap_used += tokens
            plan.swap_tokens += tokens
            plan.swap_blocks += self.n[i] * self._swap_pieces(self.kv_len[i])
            plan.swapped_out.append(i)
            self.swapped.append(i)
            self.num_swap_outs += 1
            self.swapped_tokens += tokens
        else:
            if swap and not self.prefill_left[i]:
                self.swap_fallbacks += 1
                plan.swap_fallbacks += 1
            self._to_recompute(i, plan)

    def _to_recompute(self, i: int, plan: StepPlan) -> None:
        """Drop request `i`'s KV (counted as recomputed) and queue it first to prefill again."""
        computed = self.kv_len[i] - self.prefill_left[i]   # the prompt once, each sample's outputs
        n = self.n[i]
        dropped = computed if n == 1 else computed + (n - 1) * max(0, computed - self.prompt[i])
        self.recomputed_tokens += dropped
        plan.recomputed_tokens += dropped
        self.prefill_left[i] = 0
        self.waiting.appendleft(i)

    def _swap_in(self, plan: StepPlan) -> None:
        """Bring swapped requests back FCFS while memory allows; they decode in this same step
        (each sample is restored unshared)."""
        while self.swapped:
            i = self.swapped[0]
            kv, final, seqs = self.kv_len[i], self.prompt[i] + self.output[i] - 1, self.seq_ids(i)
            restored, can_hold = [], getattr(self.alloc, "can_hold", None)   # (hybrid: all kv + 1 at once)
            for s in seqs:                  # each sample separately: blocks or extents do not pool
                if not self.alloc.can_allocate(kv + 1, final, (), s) or \
                        (can_hold is not None and not can_hold(kv + 1, kv + 1, (), s)):
                    break
                self.alloc.allocate(s, kv + 1, final)
                restored.append(s)
            if len(restored) < len(seqs):
                for s in restored:
                    self.alloc.free(s)
                if self.running:
                    break
                # nothing runs, so nothing will make room: a context that does not come back whole into
                # this cache (the hybrid manager restores every window entry at once, a prefill only the
                # window's) is recomputed instead of waiting forever, counted as a swap fallback
                self.swapped.popleft()
                self.swap_used -= kv * len(seqs)
                self.swap_fallbacks += 1
                plan.swap_fallbacks += 1
                self._to_recompute(i, plan)
                continue
            self.swapped.popleft()
            plan.allocated.extend((s, 0) for s in seqs)
            plan.swapped_in.append(i)
            self.swap_used -= kv * len(seqs)
            plan.swap_tokens += kv * len(seqs)
            plan.swap_blocks += len(seqs) * self._swap_pieces(kv)
            self.num_swap_ins += 1
            self.swapped_tokens += kv * len(seqs)
            self.kv_len[i] = kv + 1
            self.running.append(i)
            self.running_seqs += self.n[i]
            plan.decodes.append(i)
            plan.decode_seqs += len(seqs)
            plan.decode_context_tokens += (kv + 1) * len(seqs)
