"""Hypothesis state machines for Jenga's allocator (kvsim/alloc/jenga/): random groups with random page bytes,
block sizes and pools under allocate / append / append_each / free, with `check_invariants()` after every
step and checks written here independently of the allocator:
- table shapes from vLLM's rules (cdiv(tokens, block_size) entries, Mamba 1; skipped heads null);
- a refusal happens exactly when the pages asked for do not fit, recounted from the tables: a group's free
  small pages are its large pages' pages minus those the tables hold, plus whole free large pages;
- freeing a request frees every large page that held only its pages (request-aware placement's point);
- with one page size for every group, Jenga is vLLM's hybrid manager: the same tables, block for block,
  and the same breakdown as `HybridAllocator` after every step.
"""

from math import lcm

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.alloc import AllocationError
from kvsim.alloc.hybrid import NULL_BLOCK, GroupSpec, HybridAllocator
from kvsim.alloc.jenga import JengaAllocator, JengaGroup

from tests.quick_examples import examples

pick = st.integers(0, 10_000)
kinds = st.one_of(st.just(("full", 0, 0)), st.just(("mamba", 0, 0)),
                  st.tuples(st.just("sliding"), st.integers(1, 7), st.just(0)),
                  st.tuples(st.just("chunked"), st.just(0), st.integers(1, 7)))
IN_FLIGHT = 8


def skipped(kind, window, chunk, computed, bs):
    if kind == "sliding":
        return max(0, computed - window + 1) // bs
    if kind == "chunked":
        return computed // chunk * chunk // bs
    return 0


class Machine(RuleBasedStateMachine):
    """Drives `self.alloc` (and, when `self.twin` is set, a HybridAllocator in lockstep)."""

    twin = None

    def __init__(self):
        super().__init__()
        self.tokens, self.computed_at, self.first, self.next_id = {}, {}, {}, 0

    def _live(self, index):
        return sorted(self.tokens)[index % len(self.tokens)]

    def _free_pages(self):
        """Per group: pages it could take now, recounted from the tables and the large pages' owners."""
        a = self.alloc
        held = [0] * len(a.groups)
        for seq in self.tokens:
            for g, t in enumerate(a.group_block_tables(seq)):
                held[g] += sum(b != NULL_BLOCK for b in t)
        owned = [a.pool.owner.count(g) for g in range(len(a.groups))]
        return [owned[g] * n - held[g] for g, n in enumerate(a.layout.pages_per_large)], a.pool.owner.count(-1)

    def _fits(self, counts):
        stranded, free_large = self._free_pages()
        per = self.alloc.layout.pages_per_large
        return sum(max(0, -(-(c - s) // n)) for c, s, n in zip(counts, stranded, per)) <= free_large

    def _need(self, seq, n):
        a, new, out = self.alloc, self.tokens[seq] + n, []
        for spec, t in zip(a.groups, a.group_block_tables(seq)):
            out.append(max(0, (1 if spec.kind == "mamba" else -(-new // a.block_size)) - len(t)))
        return out

    @rule(num_tokens=st.integers(1, 30), extra=st.integers(0, 30), hold=st.integers(1, IN_FLIGHT))
    def allocate(self, num_tokens, extra, hold):
        seq, a, bs = self.next_id, self.alloc, self.alloc.block_size
        self.next_id += 1
        hold = min(hold, num_tokens)
        ok = a.can_allocate(num_tokens, num_tokens + extra) and a.can_hold(hold, num_tokens)
        if self.twin is not None:
            assert (self.twin.can_allocate(num_tokens, num_tokens + extra)
                    and self.twin.can_hold(hold, num_tokens)) == ok
        first = [1 if g.kind == "mamba" else -(-hold // bs) for g in a.groups]
        assert a.can_hold(hold, num_tokens) == self._fits(first), "can_hold disagrees with the recount"
        if ok:
            a.allocate(seq, num_tokens, num_tokens + extra, hold_tokens=hold)
            if self.twin is not None:
                self.twin.allocate(seq, num_tokens, num_tokens + extra, hold_tokens=hold)
            self.tokens[seq], self.computed_at[seq] = hold, 0
            self.first[seq] = (num_tokens, num_tokens + extra)

    def _moved(self, seq):
        """Asking to grow moved `seq`'s windows (its skipped pages are freed before counting)."""
        self.computed_at[seq] = self.tokens[seq]

    @precondition(lambda self: self.tokens)
    @rule(index=pick, n=st.integers(1, 5))
    def append(self, index, n):
        seq = self._live(index)
        ok = self.alloc.can_append(seq, n)
        if self.twin is not None:
            assert self.twin.can_append(seq, n) == ok
        self._moved(seq)
        assert ok == self._fits(self._need(seq, n)), "can_append disagrees with the recount"
        if ok:
            assert self.alloc.append(seq, n) == []
            if self.twin is not None:
                self.twin.append(seq, n)
            self.tokens[seq] += n
        else:
            try:
                self.alloc.append(seq, n)
            except AllocationError:
                pass
            else:
                raise AssertionError("append succeeded although can_append said no")

    @precondition(lambda self: self.tokens)
    @rule(data=st.data())
    def append_each(self, data):
        seqs = data.draw(st.lists(st.sampled_from(sorted(self.tokens)), unique=True, min_size=1))
        grew = self.alloc.append_each(seqs)
        if self.twin is not None:
            assert self.twin.append_each(seqs) == grew
        for seq in seqs[:grew]:
            self._moved(seq)
            self.tokens[seq] += 1
        if grew < len(seqs):
            self._moved(seqs[grew])
            assert not self._fits(self._need(seqs[grew], 1)), "append_each stopped although it fits"

    @precondition(lambda self: self.tokens)
    @rule(index=pick)
    def free(self, index):
        seq, a = self._live(index), self.alloc
        alone = set()
        for g, n in enumerate(a.layout.pages_per_large):
            mine = {b // n for b in a.group_block_tables(seq)[g] if b != NULL_BLOCK}
            others = {b // n for s in self.tokens if s != seq for b in a.group_block_tables(s)[g] if b != NULL_BLOCK}
            alone |= mine - others
        a.free(seq)
        if self.twin is not None:
            self.twin.free(seq)
        assert all(a.pool.owner[p] == -1 for p in alone), "a large page held only by the freed request stays held"
        del self.tokens[seq], self.computed_at[seq], self.first[seq]

    @invariant()
    def agrees_with_the_model(self):
        a = getattr(self, "alloc", None)
        if a is None:
            return
        a.check_invariants()
        bs = a.block_size
        for seq, tokens in self.tokens.items():
            alone = 0              # large pages its pages would fill alone
            for spec, table, n in zip(a.groups, a.group_block_tables(seq), a.layout.pages_per_large):
                assert len(table) == (1 if spec.kind == "mamba" else -(-tokens // bs))
                nulls = min(skipped(spec.kind, spec.window, spec.chunk, self.computed_at[seq], bs), len(table))
                assert table[:nulls] == [NULL_BLOCK] * nulls and NULL_BLOCK not in table[nulls:]
                alone += -(-(len(table) - nulls) // n)
            num_tokens, final = self.first[seq]
            assert alone * a.layout.slots_per_large <= a.peak_slots(num_tokens, max(final, tokens)), \
                "peak_slots is not an upper bound"
        if self.twin is not None:
            for seq in self.tokens:
                assert a.group_block_tables(seq) == self.twin.group_block_tables(seq)
            j, h = a.stats(), self.twin.stats()
            assert j.external_fragmentation == 0
            assert (j.token_states, j.reserved, j.internal_fragmentation, j.free, j.used_blocks) == \
                (h.token_states, h.reserved, h.internal_fragmentation, h.free, h.used_blocks)

    def teardown(self):
        a = getattr(self, "alloc", None)
        if a is not None:
            for seq in list(self.tokens):
                a.free(seq)
            a.check_invariants()
            assert a.num_free_large == a.layout.num_large


class JengaMachine(Machine):
    @initialize(kinds=st.lists(kinds, min_size=1, max_size=3), data=st.data(), block_size=st.integers(1, 4),
                empty_first=st.booleans())
    def build(self, kinds, data, block_size, empty_first):
        groups = [JengaGroup(k, w, c, data.draw(st.integers(1, 6))) for k, w, c in kinds]
        large = lcm(*(g.page_bytes for g in groups))
        pool = data.draw(st.integers(large, 12 * large))
        self.alloc = JengaAllocator(pool, block_size, groups, max_model_len=10_000, max_in_flight_tokens=IN_FLIGHT,
                                    prefill_chunk_tokens=IN_FLIGHT, empty_first=empty_first)


class SamePageMachine(Machine):
    @initialize(kinds=st.lists(kinds, min_size=1, max_size=3), block_size=st.integers(1, 4),
                page=st.integers(1, 5), num_blocks=st.integers(1, 40))
    def build(self, kinds, block_size, page, num_blocks):
        self.alloc = JengaAllocator(num_blocks * page + page - 1, block_size,
                                    [JengaGroup(k, w, c, page) for k, w, c in kinds], max_model_len=10_000,
                                    max_in_flight_tokens=IN_FLIGHT, prefill_chunk_tokens=IN_FLIGHT)
        self.twin = HybridAllocator(num_blocks, block_size, [GroupSpec(k, w, c) for k, w, c in kinds],
                                    max_model_len=10_000, max_in_flight_tokens=IN_FLIGHT,
                                    prefill_chunk_tokens=IN_FLIGHT)


SETTINGS = settings(**examples(max(200, settings.default.max_examples)), stateful_step_count=40, deadline=None)
TestJenga = JengaMachine.TestCase
TestJenga.settings = SETTINGS
TestJengaEqualsHybridAtOnePageSize = SamePageMachine.TestCase
TestJengaEqualsHybridAtOnePageSize.settings = SETTINGS
