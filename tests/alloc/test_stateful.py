"""Hypothesis state machines driving random allocate/append/fork/free/stats sequences against each
allocator, with `check_invariants()` after every step and a leak check at teardown. A plain dict of
sequence lengths is the model the allocator must agree with."""

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.alloc import AllocationError, ContiguousAllocator, PagedAllocator

from tests.quick_examples import examples

pick = st.integers(0, 10_000)     # index into the live sequences, taken modulo their number


class AllocatorMachine(RuleBasedStateMachine):
    """Rules shared by both allocators; subclasses build the allocator in an `initialize` rule."""

    def __init__(self):
        super().__init__()
        self.alloc = None
        self.lengths: dict[int, int] = {}    # model: seq id -> tokens written
        self.next_id = 0

    def _live(self, index):
        return sorted(self.lengths)[index % len(self.lengths)]

    def _try_allocate(self, num_tokens, final_tokens, **kwargs):
        seq = self.next_id
        self.next_id += 1
        if self.alloc.can_allocate(num_tokens, final_tokens, kwargs.get("block_hashes", ()), seq):
            cached = self.alloc.allocate(seq, num_tokens, final_tokens, **kwargs)
            assert 0 <= cached <= num_tokens - 1 and cached % self.alloc.block_size == 0
            if cached:
                event("prefix hit")
            self.lengths[seq] = num_tokens
            return True
        return False

    @precondition(lambda self: self.lengths)
    @rule(index=pick, n=st.integers(1, 5))
    def append(self, index, n):
        seq = self._live(index)
        before = self.alloc.stats()
        if self.alloc.can_append(seq, n):
            copies = self.alloc.append(seq, n)
            self.lengths[seq] += n
            self.check_copies(seq, self.lengths[seq] - n, copies)
        else:
            try:
                self.alloc.append(seq, n)
            except AllocationError:
                pass
            else:
                raise AssertionError("append succeeded although can_append said no")
            assert self.alloc.stats() == before, "a failed append changed the allocator"

    @rule(data=st.data())
    def append_each(self, data):
        """The batched append grows a prefix of the list, exactly as can_append + append would."""
        live = sorted(self.lengths)
        if not live:
            return
        seqs = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=6))
        copies = []
        grown = self.alloc.append_each(seqs, 0, copies)
        assert 0 <= grown <= len(seqs)
        for seq in seqs[:grown]:
            self.lengths[seq] += 1
        if grown < len(seqs):
            assert not self.alloc.can_append(seqs[grown]), "append_each stopped although it could grow"
        assert len(copies) <= grown

    @rule(data=st.data(), max_steps=st.integers(0, 40), head=st.integers(0, 30))
    def append_steps(self, data, max_steps, head):
        """Many decode steps at once: within `decode_window`, one snapshot per step, the last one the
        allocator's state after, token states growing by the batch each step."""
        live = sorted(self.lengths)
        seqs = data.draw(st.lists(st.sampled_from(live), unique=True, max_size=6)) if live else []
        steps = self.alloc.decode_window(seqs, max_steps)
        assert 0 <= steps <= max_steps
        if steps == 0:
            return
        event("append_steps")
        before = self.alloc.stats(head, head + 10).token_states
        snapshots = self.alloc.append_steps(seqs, steps, head, head + 10)
        for seq in seqs:
            self.lengths[seq] += steps
        assert len(snapshots) == steps
        assert [m.token_states - before for m in snapshots] == [len(seqs) * (j + 1) for j in range(steps)]
        assert snapshots[-1] == self.alloc.stats(head, head + 10)
        for m in snapshots:
            assert m.token_states + m.reserved + m.internal_fragmentation + m.external_fragmentation \
                + m.free == self.alloc.capacity_tokens

    def check_copies(self, seq, old_length, copies):
        assert copies == []

    @precondition(lambda self: self.lengths)
    @rule(index=pick)
    def fork(self, index):
        parent = self._live(index)
        child = self.next_id
        self.next_id += 1
        if self.alloc.can_fork(parent):
            self.alloc.fork(parent, child)
            event("fork")
            self.lengths[child] = self.lengths[parent]

    @precondition(lambda self: self.lengths)
    @rule(index=pick)
    def free(self, index):
        seq = self._live(index)
        self.alloc.free(seq)
        del self.lengths[seq]

    @rule(head=st.integers(0, 80), extra=st.integers(0, 80))
    def stats(self, head, extra):
        s = self.alloc.stats(head, head + extra)
        assert min(s.token_states, s.reserved, s.internal_fragmentation, s.external_fragmentation, s.free) >= 0
        assert s.token_states + s.reserved + s.internal_fragmentation + s.external_fragmentation + s.free \
            == self.alloc.capacity_tokens

    @invariant()
    def consistent(self):
        if self.alloc is None:
            return
        self.alloc.check_invariants()
        for seq, length in self.lengths.items():
            assert self.alloc.num_tokens(seq) == length

    def teardown(self):
        if self.alloc is None:
            return
        for seq in list(self.lengths):
            self.alloc.free(seq)
        self.alloc.check_invariants()
        s = self.alloc.stats()
        assert s.free == s.capacity_tokens and s.used_blocks == 0, f"leak after freeing everything: {s}"


class PagedMachine(AllocatorMachine):
    @initialize(num_blocks=st.integers(2, 24), block_size=st.sampled_from([1, 2, 4, 16]),
                prefix_caching=st.booleans())
    def build(self, num_blocks, block_size, prefix_caching):
        self.alloc = PagedAllocator(num_blocks, block_size, prefix_caching=prefix_caching)
        self.prefix_caching = prefix_caching

    @rule(num_tokens=st.integers(1, 70), extra=st.integers(0, 40), group=st.integers(0, 2),
          diverge=st.integers(0, 4))
    def allocate(self, num_tokens, extra, group, diverge):
        # prompts of one group share content ids up to block `diverge`, so chained hashes hit
        full = num_tokens // self.alloc.block_size
        ids = [group * 100 + k if k < diverge else 1000 + self.next_id * 100 + k for k in range(full)]
        before = self.alloc.num_free_blocks
        if not self._try_allocate(num_tokens, num_tokens + extra, block_hashes=ids):
            assert -(-num_tokens // self.alloc.block_size) > before

    def check_copies(self, seq, old_length, copies):
        table = self.alloc.block_table(seq)
        if copies:      # the partly filled last block was copied into a private block in place
            [(src, dst)] = copies
            assert old_length % self.alloc.block_size and table[(old_length - 1) // self.alloc.block_size] == dst
            assert src != dst and src not in table
            event("copy-on-write")


class ContiguousMachine(AllocatorMachine):
    @initialize(capacity=st.integers(1, 300), max_seq_len=st.integers(1, 64),
                reserve=st.sampled_from(["max", "pow2", "oracle"]), placement=st.sampled_from(["first-fit", "buddy"]))
    def build(self, capacity, max_seq_len, reserve, placement):
        self.alloc = ContiguousAllocator(capacity, max_seq_len, reserve=reserve, placement=placement)

    @rule(num_tokens=st.integers(1, 70), extra=st.integers(0, 40))
    def allocate(self, num_tokens, extra):
        if not self._try_allocate(num_tokens, num_tokens + extra):
            try:
                self.alloc.allocate(self.next_id, num_tokens, num_tokens + extra)
            except AllocationError:
                pass
            else:
                raise AssertionError("allocate succeeded although can_allocate said no")


#: 250 examples by default; 5,000 under `pytest --long` (make test-long), whose profile sets the default;
TestPaged = PagedMachine.TestCase
TestPaged.settings = settings(**examples(max(250, settings.default.max_examples)),
                              stateful_step_count=50, deadline=None)
TestContiguous = ContiguousMachine.TestCase
TestContiguous.settings = settings(**examples(max(250, settings.default.max_examples)),
                                   stateful_step_count=50, deadline=None)
