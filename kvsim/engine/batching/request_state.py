"""Per-request state and the request lifecycle every batching policy shares. Plain Python, no SimPy.

`RequestState` keeps one column per field (a list indexed by request; event times `array('d')`: 8 bytes
a request, not a list slot and a 24-byte float), not one object per request. `SchedulerBase` owns it
with the queues: arrivals and rejection, token emission and retirement, and the read-only queries the
stepper, metrics and the GPU harness use (nobody else reads the columns or calls the allocator).
Policies (`kvsim.engine.batching.scheduler.Scheduler`, `...static_batching.StaticScheduler`) implement `schedule`.

Units: tokens and seconds (NaN until the event happens). `status`: `FINISHED`, `REJECTED`, `PENDING`.
"""

from __future__ import annotations

from array import array
from collections import deque
from typing import TYPE_CHECKING

import numpy as np

from kvsim.alloc.base import Allocator, MemoryStats
from kvsim.engine.batching.beams import BeamModel
from kvsim.engine.batching.samples import sample_ends
from kvsim.trace.table import Trace

if TYPE_CHECKING:
    from kvsim.engine.config import SchedulerConfig
    from kvsim.engine.step import StepPlan

FINISHED, REJECTED, PENDING = "finished", "rejected", "unfinished"

#: Per-request record columns, in `requests.csv` order (after `id` and `arrival_s`).
RECORD_COLUMNS = ("admitted_s", "first_token_s", "finished_s", "prompt_tokens", "output_tokens", "n",
                  "preemptions", "status", "reason")


class RequestState:
    """The trace's lengths plus each request's progress; `n` is the number of live sequences,
    max(samples, beam width) until samples shorter than the request end (`samples` keeps the count)."""

    def __init__(self, trace: Trace):
        self.prompt: list[int] = trace.prompt_tokens.tolist()
        self.output: list[int] = trace.output_tokens.tolist()
        self.n: list[int] = np.maximum(trace.n, trace.beam_width).tolist()
        self.samples: list[int] = list(self.n)
        self.beam: list[int] = trace.beam_width.tolist()
        num = len(self.prompt)
        self.generated = [0] * num          # output tokens emitted so far (per sample)
        self.prefill_left = [0] * num       # prompt tokens still to compute (chunked prefill)
        self.kv_len = [0] * num             # KV slots each of the request's sequences holds
        self.preemptions = [0] * num
        self.admitted_s = array("d", [float("nan")]) * num
        self.first_token_s, self.finished_s = array("d", self.admitted_s), array("d", self.admitted_s)
        self.status = [PENDING] * num
        self.reason = [""] * num

    def columns(self) -> dict[str, np.ndarray]:
        """The per-request records as numpy columns (`RECORD_COLUMNS`)."""
        return {"admitted_s": np.array(self.admitted_s), "first_token_s": np.array(self.first_token_s),
                "finished_s": np.array(self.finished_s), "prompt_tokens": np.array(self.prompt, np.int64),
                "output_tokens": np.array(self.output, np.int64), "n": np.array(self.samples, np.int64),
                "preemptions": np.array(self.preemptions, np.int64),
                "status": np.array(self.status, dtype=object), "reason": np.array(self.reason, dtype=object)}


class SchedulerBase:
    """Queues and per-request state over one allocator; subclasses decide each step (`schedule`)."""
    settle_lag, settling = False, {}    # async scheduling (kvsim/engine/batching/settle.py): off

    def __init__(self, trace: Trace, allocator: Allocator, config: SchedulerConfig,
                 max_seq_len: int, swap_tokens: int = 0, block_ids=None, seed: int = 0):
        """`swap_tokens`: CPU swap space in KV slots; `block_ids(i)`: prompt block content ids for
        prefix caching (None without); `seed`: the run's (beam search draws, `kvsim.engine.batching.beams`)."""
        self.alloc, self.cfg, self.max_seq_len = allocator, config.with_fixed_limits(), max_seq_len
        # frees a sequence that is done for good (a prefix cache need not keep its own blocks findable)
        self._free_done = getattr(allocator, "free_finished", allocator.free)
        self.swap_tokens = swap_tokens
        self.block_ids = block_ids          # callable(i) -> prompt block content ids, or None
        self.requests = req = RequestState(trace)
        # the state's columns under short names (the hot loops index them directly)
        self.prompt, self.output, self.n, self.generated = req.prompt, req.output, req.n, req.generated
        self.prefill_left, self.kv_len, self.preemptions = req.prefill_left, req.kv_len, req.preemptions
        self.admitted_s, self.first_token_s, self.finished_s = req.admitted_s, req.first_token_s, req.finished_s
        self.status, self.reason = req.status, req.reason
        self.beam = req.beam
        # beam search (kvsim.engine.batching.beams): None when no request has beams or they never die (plain samples)
        rate = config.beam_death_rate
        self.beams = BeamModel(rate, seed) if rate > 0 and max(self.beam, default=1) > 1 else None
        self.beam_forks = 0                 # dead beams replaced by forks of survivors
        self.beam_copied_slots = 0          # KV slots copied by those forks (contiguous memory)
        # request -> lengths of its samples that end before it, longest first (kvsim.engine.batching.samples)
        self.sample_ends = sample_ends(trace, config.sample_lengths, seed)
        self.stride = max(self.n, default=1)
        self.waiting: deque[int] = deque()
        self.swapped: deque[int] = deque()
        self.running: list[int] = []        # admission order; the last is preempted first
        self.running_seqs = 0               # sequences of the running requests
        self.swap_used = 0
        self.num_preemptions = 0
        self.prefix_hit_tokens = 0          # cached prompt tokens at first admissions
        self.cpu_hit_tokens = 0             # of which loaded from the CPU tier (kvsim/alloc/cpu_tier.py)
        self.admitted_prompt_tokens = 0     # prompt tokens of requests admitted at least once
        self.num_swap_outs = self.num_swap_ins = 0      # requests moved to and from CPU memory
        self.swapped_tokens = 0             # KV slots moved over PCIe, both ways, all sequences
        self.swap_fallbacks = 0             # swaps refused for want of swap space (recomputed)
        self.recomputed_tokens = 0          # computed tokens dropped by recompute preemption
        self.num_finished = self.num_rejected = 0
        self._never: dict[tuple[int, int, int], str] = {}   # (prompt, output, n) -> `never_served`

    # -- arrivals -------------------------------------------------------------------------------
    def add(self, i: int, now: float) -> None:
        """Queue request `i` (arrived at `now`), or reject it if it can never be served."""
        reason = self.never_served(i)
        if reason:
            self._reject(i, now, reason)
        else:
            self.waiting.append(i)

    def never_served(self, i: int) -> str:
        """Why request `i` can never be served here (rejected on arrival), or "" when it can (the answer
        depends only on its lengths and sample count: kept for the next request with the same)."""
        p, m = self.prompt[i], self.output[i]
        reason = self._never.get((p, m, self.n[i]))
        if reason is None:
            reason = self._never[p, m, self.n[i]] = self._never_served(i, p, m)
        return reason

    def _never_served(self, i: int, p: int, m: int) -> str:
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

    # -- after the step ------------------------------------------------------------------------
    def finish(self, plan: StepPlan, now: float) -> None:
        """Emit the step's tokens at time `now` and retire finished requests (into `plan.finished`)."""
        plan.finished = self._emit(plan, now)
        if self.sample_ends:
            self._end_samples(plan)
        self._retire(plan.finished, now)

    def _end_samples(self, plan: StepPlan) -> None:
        """Free the samples that reached their own length this step (`plan.samples_ended`), the
        request's last sequences first (its samples are numbered longest first); requests that
        finished are retired whole."""
        ends, generated, output, stride = self.sample_ends, self.generated, self.output, self.stride
        for i in [i for i, _ in plan.prefills] + plan.decodes:
            e = ends.get(i)
            if e is None or e[-1] > generated[i] or generated[i] >= output[i]:
                continue
            while e and e[-1] <= generated[i]:
                e.pop()
                self.n[i] -= 1
                seq = i * stride + self.n[i]
                self._free_done(seq)
                self.running_seqs -= 1
                plan.samples_ended.append(seq)
            if not e:
                del ends[i]

    def _prefills_done(self, plan: StepPlan, now: float) -> list[int]:
        """The step's requests that finished their prefill, in batch order; the first token of each is
        stamped at `now` (unless a recompute already emitted it)."""
        done, prefill_left, first_token_s = [], self.prefill_left, self.first_token_s
        for i, _ in plan.prefills:
            if prefill_left[i] == 0:
                done.append(i)
                if first_token_s[i] != first_token_s[i]:   # NaN: no first token yet
                    first_token_s[i] = now
        return done

    def _emit(self, plan: StepPlan, now: float) -> list[int]:
        """Count the step's tokens (first tokens stamped at `now`); returns requests now complete."""
        done = self._prefills_done(plan, now) if plan.prefills else []
        done.extend(plan.decodes)
        retire, generated, output = [], self.generated, self.output
        for i in done:
            g = generated[i] + 1
            generated[i] = g
            if g == output[i]:
                retire.append(i)
        return retire

    def _retire(self, retire: list[int], now: float, in_order: bool = False) -> None:
        """Free finished requests in batch order (vLLM's order: it decides which freed blocks the
        prefix cache evicts first); `in_order`: `retire` is in that order already."""
        if len(retire) > 1 and not in_order:
            done = set(retire)
            retire = [i for i in self.running if i in done]
        for i in retire:
            self.running.remove(i)
            self.running_seqs -= self.n[i]
            self._finished_blocks(i)
            self.status[i], self.finished_s[i] = FINISHED, now
            self.num_finished += 1

    def _finished_blocks(self, i: int) -> None:
        """What becomes of finished request `i`'s blocks: freed (a prefill instance keeps them)."""
        for s in self.seq_ids(i):
            self._free_done(s)
            if self.beams is not None:
                self.beams.forget(i)

    def _beam_step(self, decoding: list[int], plan: StepPlan) -> None:
        """Before a decode step's slots are taken: replace the beams that died after the last step
        by forks of survivors (`kvsim.engine.batching.beams`), from each beam request's second generated token on.
        Paged memory shares the parent's blocks (copy-on-write on the next append); contiguous memory
        copies the parent's slots into the dead beam's reservation (`plan.copied_slots`)."""
        beam, generated, stride, alloc = self.beam, self.generated, self.stride, self.alloc
        for i in decoding:
            if beam[i] > 1 and generated[i] >= 2:
                base = i * stride
                for parent, child in self.beams.replacements(i, self.n[i]):
                    copied = alloc.refork(base + parent, base + child)
                    plan.reforked.append((base + parent, base + child))
                    plan.copied_slots += copied
                    self.beam_forks += 1
                    self.beam_copied_slots += copied

    def beams_running(self) -> bool:
        """Whether a running request's beams may die at its next step (no exact fast-forward then)."""
        return self.beams is not None and any(self.beam[i] > 1 for i in self.running)

    # -- helpers --------------------------------------------------------------------------------
    def seq_ids(self, i: int) -> range:
        """Sequence ids of request `i` (one per sample), as the allocator knows them."""
        return range(i * self.stride, i * self.stride + self.n[i])

    def request_of(self, seq_id: int) -> int:
        """The request sequence `seq_id` belongs to."""
        return seq_id // self.stride

    def head_of_queue(self) -> tuple[int, int]:
        """(tokens needed now, peak tokens) of the request waiting first; (0, 0) when none."""
        if not self.waiting:
            return 0, 0
        i = self.waiting[0]
        return self.prompt[i] + self.generated[i], self.prompt[i] + self.output[i] - 1

    def memory(self) -> MemoryStats:
        """The allocator's memory breakdown now, judged against the head of the queue."""
        return self.alloc.stats(*self.head_of_queue()) if self.waiting else self.alloc.stats()

    def step_contexts(self, plan: StepPlan) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """`plan`'s prefill chunks as (tokens, context after the chunk) and its decodes as (context with
        the new token, sequences), for cost models that price each sequence's own context."""
        kv_len, left, n = self.kv_len, self.prefill_left, self.n
        return ([(q, max(kv_len[i] - left[i], q)) for i, q in plan.prefills],
                [(kv_len[i], n[i]) for i in plan.decodes])

    def window_contexts(self) -> list[tuple[int, int]]:
        """(context with the next token, sequences) of each running request: the first step of a
        fast-forward window (`steady_decodes`)."""
        kv_len, n = self.kv_len, self.n
        return [(kv_len[i] + 1, n[i]) for i in self.running]

    def kv_groups(self) -> tuple:
        """The allocator's distinct KV cache group specs (`kind`, any `window` / `chunk`), in order; () for
        an allocator without groups. (Memory snapshots add up the groups of one spec.)"""
        return tuple(dict.fromkeys(getattr(self.alloc, "groups", ())))

    def computed_tokens(self, i: int) -> int:
        """KV slots of request `i` (each sequence) computed so far: prompt chunks and outputs."""
        return self.kv_len[i] - self.prefill_left[i]

    def final_tokens(self, i: int) -> int:
        """KV slots each of request `i`'s sequences holds at its peak (prompt + output - 1)."""
        return self.prompt[i] + self.output[i] - 1

    def block_tables(self, groups: bool = False) -> dict[int, list[int]] | dict[int, list[list[int]]]:
        """Block ids of every sequence of the running requests (paged allocators only); with `groups`,
        one table per KV cache group (the hybrid allocator's `group_block_tables`; else one group)."""
        alloc = self.alloc
        each = ((getattr(alloc, "group_block_tables", None) or (lambda s: [alloc.block_table(s)])) if groups
                else alloc.block_table)
        return {s: each(s) for i in self.running for s in self.seq_ids(i)}

    def request_columns(self) -> dict[str, np.ndarray]:
        """Per-request records as numpy columns (`RECORD_COLUMNS`), for metrics."""
        return self.requests.columns()
