"""Lazy decode steps for continuous batching: a decode step costs O(1) plus the sequences that cross a
block boundary or finish, not O(batch). Plain Python, no SimPy; a mixin of `kvsim.engine.batching.scheduler.Scheduler`.

When the allocator can tick (paged, with or without a prefix cache; `tick_join_many` etc. in
kvsim/alloc/paged/window.py; vLLM's hybrid manager in kvsim/alloc/hybrid/ticks.py; contiguous
reservations in kvsim/alloc/contiguous/ticks.py) and no request's
sequences fork or end mid-request (parallel samples that all run to the request's length tick one by one,
in batch order; dying beams and shorter samples do not), a running request that has
finished its prefill is a *member*: its `kv_len` and `generated` are kept as of clock `_since[i]`
and advance with the step clocks (`_kv_clock` counts the steps that grew the batch's KV slots,
`_gen_clock` the steps that emitted their tokens; equal between steps), so it holds
`kv_len[i] + _kv_clock - _since[i]` slots. Its last step is filed in the heap `_ends` by the value
of `_gen_clock` at which it emits its last token. The sum of the members' KV slots is kept as
`_context`. Whoever reads a member's state brings it up to date first (`_sync`); preemption and
retirement take it out (`_leave`). The allocator grows the members' sequences the same way, taking
blocks in the batch's order, so every output equals stepping each sequence (kvsim/engine/batching/scheduler.py).

Running requests that are not members are those whose (chunked) prefill is under way; admission,
prefill chunks, prefix-cache hits and swap-ins take the scheduler's own path for them. Members tick
in the order they joined, which is the batch's order as long as every request that is not a member
runs behind every member (admissions and swap-ins join the batch at its back); a step that breaks
that (a swap-in behind a request still prefilling its chunks) ends the lazy mode for the rest of the
run (`_stop_lazy`: the members are brought up to date and the per-sequence path goes on from there).
A cost model that prices sliding/chunked layers per sequence (`track_capped_reads`) gets the members'
reads from sums kept by clock (kvsim/engine/batching/capped_reads.py), not by visiting them (`step_reads`).
"""

from __future__ import annotations

import heapq

from kvsim.alloc.base import MemoryStats
from kvsim.engine.batching.capped_reads import CappedReads, LazyCappedReads
from kvsim.engine.batching.request_state import FINISHED


class LazyDecodes(LazyCappedReads):
    """The members' clocks and the lazy versions of `_grow_running`, `finish`, `steady_decodes` and
    `advance` (used only when `_lazy`)."""

    def _lazy_init(self) -> None:
        alloc = self.alloc
        # parallel samples too (their forks share the prompt: copy-on-write in the first tick), while
        # no beam dies and every sample runs to the request's length (no fork or free mid-request)
        self._lazy = (getattr(alloc, "can_tick", False) and (self.stride == 1 or self.beams is None)
                      and not self.sample_ends and type(self).finish is LazyDecodes.finish)   # (not static)
        self._kv_clock = self._gen_clock = 0
        self._since: dict[int, int] = {}      # member request -> clock its stored state is as of
        self._keys: dict[int, int] = {}       # member request -> its join key
        self._ends: list[tuple[int, int, int]] = []   # (last token's _gen_clock, join key, request)
        self._context = 0                     # KV slots of the members, now (all their sequences)
        self._member_seqs = 0                 # sequences of the members
        self._joins = 0                       # join counter: the members' batch order
        self._ticked = False                  # a lazy decode step grew the batch, not yet emitted
        self._capped_groups: tuple = ()       # capped layers the cost model prices per sequence
        self._reads: CappedReads | None = None   # the members' reads in them (lazy only)
        self._growing = None                  # the plan `_grow_lazy` is growing (for `_preempt_last`)

    # -- membership ------------------------------------------------------------------------------
    def _join(self, requests: list[int]) -> None:
        """Make those of `requests` (in batch order) that go on decoding members."""
        generated, output, kv_len, since, keys, ends, n = (self.generated, self.output, self.kv_len,
                                                           self._since, self._keys, self._ends, self.n)
        clock, key, one = self._gen_clock, self._joins, self.stride == 1
        joining = []                                # their sequences, in batch order
        for i in requests:
            if generated[i] < output[i]:
                since[i], keys[i] = clock, key
                self._context += kv_len[i] * n[i]
                self._member_seqs += n[i]
                heapq.heappush(ends, (clock + output[i] - generated[i], key, i))
                if one:
                    joining.append(i)
                else:
                    joining.extend(self.seq_ids(i))     # (its samples, in batch order)
                if self._reads is not None:
                    self._reads.join(i, key, kv_len[i])
                key += 1
        self._joins = key
        if joining:
            self.alloc.tick_join_many(joining)

    def keep_contexts_exact(self) -> None:
        """Keep every request's `kv_len` current at each step (no lazy members), for a cost model that
        prices each sequence's own context (`step_contexts`). Call before the first step."""
        self._lazy = False

    def _sync(self, i: int) -> None:
        """Bring member `i`'s `kv_len` and `generated` up to `_gen_clock` (exact between steps;
        during a step that grew the batch, `kv_len` is one behind until the step emits)."""
        since = self._since.get(i)
        if since is not None:
            d = self._gen_clock - since
            self.kv_len[i] += d
            self.generated[i] += d
            self._since[i] = self._gen_clock

    def _leave(self, i: int) -> None:
        """Take request `i` out of the members (preempted or retired), its state brought up to date."""
        since = self._since.pop(i, None)
        if since is not None:          # (`_sync`, inlined: brought up to `_gen_clock`, then `_kv_clock`)
            d = self._gen_clock - since
            self.generated[i] += d
            self.kv_len[i] += d + self._kv_clock - self._gen_clock
            del self._keys[i]
            self._context -= self.kv_len[i] * self.n[i]
            self._member_seqs -= self.n[i]
            if self._reads is not None:
                self._reads.leave(i)

    def _sync_all(self) -> None:
        for i in list(self._since):
            self._sync(i)

    def _stop_lazy(self) -> None:
        """Leave the lazy mode between steps: every member's state brought up to date, none left (the
        allocator stops ticking a sequence at its next per-sequence append)."""
        self._sync_all()
        self._since.clear()
        self._keys.clear()
        self._ends.clear()
        self._context = self._member_seqs = 0
        self._lazy = False
        self._reads = None

    # -- what the base class reads, brought up to date ---------------------------------------------
    def finish(self, plan, now: float) -> None:
        if self._lazy:
            self._finish_lazy(plan, now)
        else:
            super().finish(plan, now)

    def computed_tokens(self, i: int) -> int:
        self._sync(i)
        return super().computed_tokens(i)

    def request_columns(self):
        self._sync_all()
        return super().request_columns()

    # -- one step --------------------------------------------------------------------------------
    def _grow_lazy(self, plan) -> bool:
        """`_grow_running` for members: one tick of the allocator (blocks for the sequences that cross
        a boundary, preempting from the back while one is missing) and of `_kv_clock`."""
        running, preempted, since = self.running, False, self._since
        if running:
            if not self.alloc.tick(plan.copies):
                # a block short: preempt the batch's last request, and so on each time
                # (`_preempt_last`) as the tick goes on
                preempted, self._growing = True, plan
                self._preempt(running[-1], plan)
                self.alloc.tick(plan.copies, self._preempt_last)
            self._kv_clock += 1
            self._context += self._member_seqs
            self._ticked = True
            if self._reads is not None:
                self._reads.advance(self._kv_clock)
        # the members, in batch order (the rest prefill behind them: chunks, `_continue_prefills`)
        settling = self.settling        # (async scheduling's held requests: in the batch, not members)
        if len(since) == len(running):
            plan.decodes = running[:]
        elif len(since) + len(settling) == len(running) and len(settling) <= 16:
            plan.decodes = running[:]       # (only members and held ones: the few held ones taken out)
            for i in settling:
                plan.decodes.remove(i)
        else:
            plan.decodes = [i for i in running if i in since]
        plan.decode_seqs = self._member_seqs
        plan.decode_context_tokens = self._context
        return preempted

    def _preempt_last(self) -> None:
        """The lazy tick's `make_room`: preempt the batch's last request in the plan being grown."""
        self._preempt(self.running[-1], self._growing)

    def _finish_lazy(self, plan, now: float) -> None:
        """`finish` with members: the step's new decoders (finished prefills, swap-ins) emit one by
        one, the members through `_gen_clock`; those that go on decoding become members."""
        if self.settle_lag:          # (async scheduling: the step before's finished requests go first)
            self._settle(plan)
        generated, output = self.generated, self.output
        fresh = self._prefills_done(plan, now) if plan.prefills else []
        ending = self._end_members() if self._ticked else []
        new_ends = [i for i in fresh if generated[i] + 1 == output[i]]
        swapped = plan.swapped_in
        swap_ends = [i for i in swapped if generated[i] + 1 == output[i]] if swapped else []
        if swapped:
            fresh.extend(swapped)
        for i in fresh:
            generated[i] += 1
        # the step's finishes in emit order (prefills, members, swap-ins), freed in batch order
        # (members, then the requests that joined the batch this step: prefills, then swap-ins)
        plan.finished = new_ends + ending + swap_ends
        if ending or new_ends or swap_ends:
            retire = ending + new_ends + swap_ends
            self._retire_lazy(retire, now)
            if self.settle_lag:
                plan.finished = retire          # (in batch order, as vLLM reports them: settle.py)
        if fresh:
            self._join(fresh)
        settling = self.settling                # (async: finished, held a step; not members)
        rest = len(self.running) - len(self._since) - len(settling)   # requests still prefilling
        if rest:
            running = [i for i in self.running if i not in settling] if settling else self.running
            if any(i in self._since for i in running[-rest:]):
                self._stop_lazy()      # one prefills ahead of a member: it would tick out of order

    def _end_members(self) -> list[int]:
        """Emit the members' tokens of the step that grew them; take out (`_leave`) and return those
        that emitted their last, in batch order."""
        self._ticked = False
        self._gen_clock += 1
        return self._ended()

    def _window_ends_lazy(self, now: float) -> list[int]:
        """`window_ends` with members: those whose last token came at the clock now, retired."""
        ending = self._ended()
        if ending:
            self._retire_lazy(ending, now)
        return ending

    def _ended(self) -> list[int]:
        """Take out (`_leave`) and return the members whose last token has come by `_gen_clock`, in
        batch order."""
        clock = self._gen_clock
        ends, keys, since, generated, kv_len, n = (self._ends, self._keys, self._since, self.generated, self.kv_len,
                                                   self.n)
        lag, ending, reads = self._kv_clock - clock, [], self._reads
        while ends and ends[0][0] <= clock:        # (equal ends pop in join order: batch order)
            _, key, i = heapq.heappop(ends)
            if keys.get(i) == key:             # (else stale: it left the members since)
                ending.append(i)
                del keys[i]                    # `_leave(i)`, inlined
                d = clock - since.pop(i)
                generated[i] += d
                kv_len[i] += d + lag
                self._context -= kv_len[i] * n[i]
                self._member_seqs -= n[i]
                if reads is not None:
                    reads.leave(i)
        return ending

    def _retire_lazy(self, retire: list[int], now: float) -> None:
        """`_retire` of requests given in batch order. Under async scheduling (settle.py) they stop
        ticking and are held until the next step's `finish` (the allocator's `tick_leave`)."""
        if self.settle_lag:
            leave = self.alloc.tick_leave
            for i in retire:
                for s in self.seq_ids(i):
                    leave(s)
            return self._mark_finished(retire, now)
        running, free, status, finished_s = self.running, self._free_done, self.status, self.finished_s
        if self.stride == 1:
            for i in retire:
                running.remove(i)
                free(i)
                status[i], finished_s[i] = FINISHED, now
            self.running_seqs -= len(retire)
        else:
            for i in retire:
                running.remove(i)
                for s in self.seq_ids(i):
                    free(s)
                status[i], finished_s[i] = FINISHED, now
                self.running_seqs -= self.n[i]
        self.num_finished += len(retire)

    # -- many steps at once ----------------------------------------------------------------------
    def _steady_lazy(self, through_end: bool = False) -> tuple[list[int], int, int] | None:
        """`steady_decodes` with members (every running request is one)."""
        if len(self._since) != len(self.running):
            return None                              # a chunked prefill is under way
        ends, keys = self._ends, self._keys
        while keys.get(ends[0][2]) != ends[0][1]:   # drop stale entries (preempted members)
            heapq.heappop(ends)
        steps = ends[0][0] - self._gen_clock - (0 if through_end else 1)
        ids = self.running[:] if self.stride == 1 else self._decoding_seq_ids(self.running)
        return ids, self.alloc.tick_window(steps), self._context

    def _advance_lazy(self, steps: int) -> list[MemoryStats]:
        """`advance` with members: `steps` ticks of the allocator and of both clocks (the memory judged
        against the head of the queue, as `memory()` is)."""
        mems = self.alloc.tick_steps(steps, *self.head_of_queue())
        self._kv_clock += steps
        self._gen_clock += steps
        self._context += steps * self._member_seqs
        if self._reads is not None:
            self._reads.advance(self._kv_clock)
        return mems
