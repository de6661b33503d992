"""FCFS admission of waiting requests for continuous batching (a mixin of
`kvsim.engine.batching.scheduler.Scheduler`): memory for the whole sequence less its prefix-cache hits, the first
prefill chunk, parallel samples forked from the first sequence. Plain Python, no SimPy. Units: KV slots.
"""

from __future__ import annotations

from kvsim.engine.step import LIMITS, StepPlan

_KV, _SEQS, _BUDGET = (LIMITS.index(name) for name in ("kv_memory", "max_num_seqs", "token_budget"))


class Admission:
    """`_admit`, its path for one-sequence requests (`_admit_one_each`) and its helpers (`_prefill_chunk`,
    `_batch_fits`, `_fork_samples`, `_regrow`). Under async scheduling (`kvsim.engine.step.Stepper`
    sets `admit_cutoff`) a request that arrived after `admit_cutoff` waits (`deferred`) for the next step:
    vLLM V1 schedules step N + 1 while step N runs (vllm PR #19970)."""

    admit_cutoff: float | None = None     # admit only requests that arrived by then (None: any)
    deferred = False                      # whether the last admission stopped at that cutoff
    arrival_times: tuple = ()             # request arrival times (s), set where the cutoff is used
    async_lag = False                     # whether the stepper sets the cutoff (vllm-v1's time model)

    def _prefill_chunk(self, i: int, plan: StepPlan, budget: int) -> int:
        chunk = min(self.prefill_left[i], budget) if self.cfg.chunked_prefill else self.prefill_left[i]
        self.prefill_left[i] -= chunk
        context = max(self.kv_len[i] - self.prefill_left[i], chunk)   # (n > 1 recompute: an estimate)
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
        can_hold = getattr(alloc, "can_hold", None)   # optional: whether this step's blocks fit
        take_loaded = getattr(alloc, "take_loaded_tokens", None) if self.block_ids else None
        admission = getattr(alloc, "admission", None)   # (paged: `can_allocate` and `cached_tokens` at once)
        clip = getattr(alloc, "clip_chunk", None)       # (hybrid, Mamba prefix caching: block-aligned chunks)
        plan.limited_by = _BUDGET           # what stops admission while requests wait
        if self._lazy and can_hold is None and self.stride == 1 and (admission is not None or not self.block_ids):
            return self._admit_one_each(plan, budget, now)
        prompt, generated, output, n, waiting = self.prompt, self.generated, self.output, self.n, self.waiting
        block_ids, max_seqs, chunked = self.block_ids, cfg.max_num_seqs, cfg.chunked_prefill
        cutoff = self.admit_cutoff
        while waiting and budget > 0:
            i = waiting[0]
            if cutoff is not None and self.arrival_times[i] > cutoff:
                self.deferred = True        # (async scheduling: it arrived after this step was scheduled)
                break
            need = prompt[i] + generated[i]           # recompute re-prefills its outputs
            final = prompt[i] + output[i] - 1
            if self.running_seqs + n[i] > max_seqs:
                plan.limited_by = _SEQS
                break
            seqs = self.seq_ids(i)
            first, many = seqs[0], len(seqs) > 1
            ids = block_ids(i) if block_ids else ()
            # diverged samples (recompute of n > 1): the prompt once, then each sample its own outputs
            own = generated[i] if many else 0
            base = need - own
            if admission is not None:
                fits, hit = admission(base, final, ids, first)
            else:
                fits, hit = alloc.can_allocate(base, final, ids, first), None
            if not fits or not self._batch_fits(i):
                plan.limited_by = _KV
                break
            if not block_ids:
                hit = 0
            elif hit is None:
                hit = alloc.cached_tokens(base, ids, first)
            compute = base - hit + own * len(seqs)
            if not chunked and compute > budget and (plan.prefills or plan.decodes):
                break       # (a lone prefill may exceed the budget: a recomputed request can)
            chunk = min(compute, budget)
            if clip is not None:
                chunk = clip(None, need - compute, chunk, prompt[i], need, cfg.max_batched_tokens)
                if not chunk:
                    break       # (vLLM: no block-aligned chunk fits the budget; admission stops)
            hold = need if many or not chunked else need - compute + chunk
            if can_hold is not None and not can_hold(min(hold, base), base, ids, first):
                plan.limited_by = _KV       # (hybrid: the first chunk's blocks, hits counted, must fit too)
                break
            cached = alloc.allocate(first, base, final, ids, min(hold, base))
            loaded = take_loaded() if take_loaded is not None else 0    # CPU tier -> GPU over PCIe
            plan.swap_tokens += loaded
            if many and (not self._fork_samples(seqs) or (own and not self._regrow(seqs, own))):
                plan.limited_by = _KV
                break
            plan.allocated.append((first, cached))
            if many:
                plan.forked.extend((first, s) for s in seqs[1:])
            waiting.popleft()
            self.kv_len[i], self.prefill_left[i] = need, compute
            if self.admitted_s[i] != self.admitted_s[i]:  # NaN: first admission
                self.admitted_s[i] = now
                self.prefix_hit_tokens += cached
                self.cpu_hit_tokens += loaded
                self.admitted_prompt_tokens += prompt[i]
            self.running.append(i)
            self.running_seqs += n[i]
            budget -= self._prefill_chunk(i, plan, budget if clip is None else chunk)

    def _admit_one_each(self, plan: StepPlan, budget: int, now: float) -> None:
        """`_admit` where every request is one sequence (id = request index) and the allocator answers
        `admission` (paged) or no prefix cache is on: the same checks and bookkeeping, `_prefill_chunk`
        included (a chunked prefill takes its hits and its first chunk's blocks now), in fewer steps
        (lazy decode's fast path: kvsim/engine/batching/lazy_decode.py); the counters are kept in locals and
        stored once."""
        alloc, waiting, max_seqs, chunked = self.alloc, self.waiting, self.cfg.max_num_seqs, self.cfg.chunked_prefill
        prompt, generated, output, admitted_s = self.prompt, self.generated, self.output, self.admitted_s
        kv_len, prefill_left, running = self.kv_len, self.prefill_left, self.running
        block_ids = self.block_ids
        admission = alloc.admission if block_ids else None
        take_loaded = alloc.take_loaded_tokens if block_ids and alloc.cpu_tier is not None else None
        batch_fits = None if type(self)._batch_fits is Admission._batch_fits else self._batch_fits
        seqs, tokens, pairs, prefills, allocated = self.running_seqs, 0, 0, plan.prefills, plan.allocated
        cutoff = self.admit_cutoff
        while waiting and budget > 0:
            i = waiting[0]
            if cutoff is not None and self.arrival_times[i] > cutoff:
                self.deferred = True        # (async scheduling: it arrived after this step was scheduled)
                break
            need = prompt[i] + generated[i]            # recompute re-prefills its outputs
            final = prompt[i] + output[i] - 1
            if seqs + 1 > max_seqs:
                plan.limited_by = _SEQS
                break
            if admission is None:
                ids, hit = (), 0
                fits = alloc.can_allocate(need, final, (), i)
            else:
                ids = block_ids(i)
                fits, hit = admission(need, final, ids, i)
            if not fits or (batch_fits is not None and not batch_fits(i)):
                plan.limited_by = _KV
                break
            compute = need - hit
            if chunked:
                chunk = compute if compute <= budget else budget
            elif compute > budget and (prefills or plan.decodes):
                break       # (a lone prefill may exceed the budget: a recomputed request can)
            else:
                chunk = compute
            cached = alloc.allocate(i, need, final, ids, hit + chunk)
            if take_loaded is not None:                # CPU tier -> GPU over PCIe
                loaded = take_loaded()
                plan.swap_tokens += loaded
            else:
                loaded = 0
            allocated.append((i, cached))
            waiting.popleft()
            kv_len[i], prefill_left[i] = need, compute - chunk
            if admitted_s[i] != admitted_s[i]:        # NaN: first admission
                admitted_s[i] = now
                self.prefix_hit_tokens += cached
                self.cpu_hit_tokens += loaded
                self.admitted_prompt_tokens += prompt[i]
            running.append(i)
            seqs += 1
            prefills.append((i, chunk))
            tokens += chunk
            pairs += chunk * (hit + chunk)
            budget -= chunk
        self.running_seqs = seqs
        plan.prefill_tokens += tokens
        plan.prefill_attn_tokens += pairs

    def _batch_fits(self, i: int) -> bool:
        """Whether request `i` may join the batch besides fitting now (continuous batching: always;
        it preempts when memory runs out later)."""
        return True

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

    def _regrow(self, seqs: range, tokens: int) -> bool:
        """Give each forked sample back its own `tokens` generated slots (copy-on-write of the shared
        partly filled prompt block); undo all and return False when they do not fit."""
        for s in seqs:
            if not self.alloc.can_append(s, tokens):
                for t in seqs:
                    self.alloc.free(t)
                return False
            self.alloc.append(s, tokens)
        return True
