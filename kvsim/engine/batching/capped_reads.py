"""What the lazy decode members (kvsim/engine/batching/lazy_decode.py) read in capped layers, kept without visiting
them: for cost models that price sliding-window and chunked-local layers from each sequence's own context
(`kvsim.cost.layer_kinds.CappedAttention`, the stepper's `_capped`). Plain Python, no SimPy.

A member's context at clock t (the scheduler's `_kv_clock`) is base + t. Per capped group, one decode
reads read(c) KV tokens per layer: a sliding window W reads min(c, W), a chunked layer of chunk C reads
(c - 1) mod C + 1 = c - C x floor((c - 1) / C). So the members' sum is `grow_base + grow x t + fixed`:
`grow` members whose read still grows with the clock (sliding: context below W; chunked: all), the sum
of their bases, and a constant part (sliding: W per member past its window; chunked: -C per chunk
boundary passed). A member changes part only at its events (sliding: its context reaches W, once;
chunked: it passes a chunk boundary, every C ticks), filed by clock. The sums are integers, exactly the
per-sequence sums `CappedAttention.time` takes, so the step times are the same to the bit. Tokens.
"""

from __future__ import annotations

from typing import Sequence


def exact_reads(groups: Sequence, decodes) -> list[int]:
    """Per group (`.read(context)`), the sum of `read(context) x sequences` over `decodes`
    (context with the new token, sequences): what the per-sequence path prices."""
    decodes = list(decodes)
    return [sum(g.read(c) * n for c, n in decodes) for g in groups]


class CappedReads:
    """The members' read sums per capped group (`groups`: objects with `kind` "sliding" or "chunked" and
    `size`, W or C), at the clock `advance` last reached."""

    def __init__(self, groups: Sequence, clock: int = 0):
        self.specs = [(g.kind == "sliding", g.size) for g in groups]
        ng = len(self.specs)
        self.clock = clock
        self.grow, self.grow_base, self.fixed = [0] * ng, [0] * ng, [0] * ng
        self._base: dict[int, tuple[int, int]] = {}      # member -> (join key, base)
        self._state: dict[tuple[int, int], int] = {}     # (group, member): sliding 1 past W; chunked boundaries
        self._due: dict[int, list[tuple[int, int, int]]] = {}   # clock -> [(group, member, join key)]

    def _file(self, t: int, g: int, i: int, key: int) -> None:
        due = self._due.get(t)
        if due is None:
            self._due[t] = [(g, i, key)]
        else:
            due.append((g, i, key))

    def join(self, i: int, key: int, context: int) -> None:
        """Member `i` (join key `key`) holds `context` tokens at the current clock."""
        t = self.clock
        base = context - t
        self._base[i] = (key, base)
        for g, (sliding, size) in enumerate(self.specs):
            if sliding:
                if context >= size:
                    self._state[g, i] = 1
                    self.fixed[g] += size
                    continue
                self._state[g, i] = 0
                self._file(size - base, g, i, key)
            else:
                w = (context - 1) // size
                self._state[g, i] = w
                self.fixed[g] -= size * w
                self._file((w + 1) * size + 1 - base, g, i, key)
            self.grow[g] += 1
            self.grow_base[g] += base

    def leave(self, i: int) -> None:
        """Member `i` leaves (its filed events go stale)."""
        key, base = self._base.pop(i)
        for g, (sliding, size) in enumerate(self.specs):
            state = self._state.pop((g, i))
            if sliding and state:
                self.fixed[g] -= size
                continue
            if not sliding:
                self.fixed[g] += size * state
            self.grow[g] -= 1
            self.grow_base[g] -= base

    def advance(self, clock: int) -> None:
        """Move the clock to `clock`, applying the members' events up to it."""
        due, base_of, state = self._due, self._base, self._state
        for t in range(self.clock + 1, clock + 1):
            events = due.pop(t, None)
            if events is None:
                continue
            for g, i, key in events:
                member = base_of.get(i)
                if member is None or member[0] != key:
                    continue                                   # stale: it left since
                sliding, size = self.specs[g]
                if sliding:                                    # its context reaches W: W from now on
                    state[g, i] = 1
                    self.grow[g] -= 1
                    self.grow_base[g] -= member[1]
                    self.fixed[g] += size
                else:                                          # it passes a chunk boundary
                    state[g, i] += 1
                    self.fixed[g] -= size
                    self._file(t + size, g, i, key)
        self.clock = clock

    def reads(self) -> list[int]:
        """Per group, the members' reads at the current clock."""
        t = self.clock
        return [b + n * t + f for b, n, f in zip(self.grow_base, self.grow, self.fixed)]


class LazyCappedReads:
    """`track_capped_reads`, `step_reads` and `window_contexts` of the scheduler (a mixin of
    `kvsim.engine.batching.lazy_decode.LazyDecodes`, which keeps `_reads` and the members)."""

    def track_capped_reads(self, groups) -> None:
        """Price `groups` (capped layers: `kind`, `size`, `read(context)`) per sequence: `step_reads` gives
        each step's reads in them, kept for the lazy members without visiting them
        (kvsim/engine/batching/capped_reads.py). Call before the first step."""
        self._capped_groups = tuple(groups)
        if self._lazy and self._capped_groups and self.stride > 1:
            self._lazy = False           # (the reads are kept per request: one sequence each)
        if self._lazy and self._capped_groups:
            self._reads = CappedReads(self._capped_groups, self._kv_clock)

    def step_reads(self, plan) -> tuple[list[tuple[int, int]], list[int]]:
        """`plan`'s prefill chunks as `step_contexts` gives them, and its decodes' reads per tracked
        capped group (the sum over sequences of what one decode reads in one layer)."""
        reads = self._reads
        if reads is None:
            prefills, decodes = self.step_contexts(plan)
            return prefills, exact_reads(self._capped_groups, decodes)
        kv_len, left = self.kv_len, self.prefill_left
        prefills = [(q, max(kv_len[i] - left[i], q)) for i, q in plan.prefills]
        total = reads.reads()
        for i in plan.swapped_in:          # (the only decodes that are not members: they join after)
            if i in plan.decodes:
                total = [r + x for r, x in zip(total, exact_reads(self._capped_groups, [(kv_len[i], self.n[i])]))]
        return prefills, total

    def window_contexts(self):
        self._sync_all()
        return super().window_contexts()
