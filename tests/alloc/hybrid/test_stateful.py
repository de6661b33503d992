"""A hypothesis state machine driving random allocate / append / append_each / free sequences against the
hybrid allocator over random KV cache groups, with `check_invariants()` after every step. The model it
must agree with is written here from vLLM 0.33's rules, independently of kvsim/alloc/hybrid/groups.py:
a table has cdiv(tokens, block_size) entries (Mamba: 1), and its leading whole blocks skipped at the last
growth, or at its prefix-cache hit (sliding: max(0, C - W + 1) tokens, chunked: C // chunk x chunk), hold
no block. Prefix caching on in half the runs, prompts drawn from three shared families; a Mamba group then
runs vLLM's "align" mode (`MambaManager`): cdiv(tokens, block_size) entries, of which only the last (the
running state) and, when C > 0 tokens were computed at the last growth, entry (C - 1) // block_size (the
state it grew from, freed at the next growth) hold a block, and with prefill checkpoint blocks (vLLM's
Mamba-2 spec) the entry before the last may too.
One vLLM quirk: with a chunk that is not a multiple of the block size, a chunked group's hit of H tokens
can null up to H / block_size entries (vLLM nulls the blocks before the chunk of the candidate length,
then cuts the hit where the chunk's blocks miss: `test_a_chunked_hit_can_null_more_than_it_skips`)."""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.alloc import AllocationError
from kvsim.alloc.hybrid import NULL_BLOCK, GroupSpec, HybridAllocator

from tests.quick_examples import examples

pick = st.integers(0, 10_000)
group_specs = st.one_of(st.just(GroupSpec("full")), st.just(GroupSpec("mamba")),
                        st.builds(GroupSpec, st.just("sliding"), window=st.integers(1, 7)),
                        st.builds(GroupSpec, st.just("chunked"), chunk=st.integers(1, 7)))
IN_FLIGHT = 8       # tokens in flight; every growth here is at most 5 tokens, the first allocation at most 8


def model_skipped_blocks(spec: GroupSpec, computed: int, block_size: int) -> int:
    if spec.kind == "sliding":
        return max(0, computed - spec.window + 1) // block_size
    if spec.kind == "chunked":
        return computed // spec.chunk * spec.chunk // block_size
    return 0


class HybridMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.tokens: dict[int, int] = {}       # model: seq -> tokens written
        self.computed_at: dict[int, int] = {}  # seq -> tokens when its windows were last moved
        self.first: dict[int, tuple[int, int]] = {}   # seq -> (num_tokens, final) at allocation
        self.hit: dict[int, int] = {}          # seq -> prefix-cache hit tokens at allocation
        self.next_id = 0

    @initialize(groups=st.lists(group_specs, min_size=1, max_size=3), block_size=st.integers(1, 4),
                num_blocks=st.integers(1, 40), caching=st.booleans(), checkpoints=st.booleans())
    def build(self, groups, block_size, num_blocks, caching, checkpoints):
        self.alloc = HybridAllocator(num_blocks, block_size, groups, max_model_len=10_000,
                                     max_in_flight_tokens=IN_FLIGHT, prefill_chunk_tokens=IN_FLIGHT,
                                     prefix_caching=caching, mamba_checkpoints=checkpoints)

    def _live(self, index):
        return sorted(self.tokens)[index % len(self.tokens)]

    @rule(num_tokens=st.integers(1, 30), extra=st.integers(0, 30), hold=st.integers(1, IN_FLIGHT),
          shared=st.integers(0, 12), family=st.integers(0, 2))
    def allocate(self, num_tokens, extra, hold, shared, family):
        """A new sequence whose first `shared` full blocks have contents of prefix `family` (prefix hits)."""
        seq, a = self.next_id, self.alloc
        self.next_id += 1
        ids = [family * 100 + k for k in range(min(shared, num_tokens // a.block_size))]
        free = a.num_free_blocks
        hit = a.cached_tokens(num_tokens, ids, seq)
        hold = min(max(hold, hit), num_tokens)
        if a.can_allocate(num_tokens, num_tokens + extra, ids, seq) and a.can_hold(hold, num_tokens, ids, seq):
            assert a.allocate(seq, num_tokens, num_tokens + extra, ids, hold_tokens=hold) == hit
            assert hit <= num_tokens - 1 and hit % a.block_size == 0
            self.tokens[seq], self.computed_at[seq] = hold, hit
            self.first[seq] = (num_tokens, num_tokens + extra)
            self.hit[seq] = hit
            bs = a.block_size
            if a._cache is None:
                assert a.num_free_blocks == free - sum(1 if g.kind == "mamba" else -(-hold // bs) for g in a.groups)
        else:
            assert a.num_free_blocks == free

    def _grown(self, seq, n):
        self.computed_at[seq] = self.tokens[seq]
        self.tokens[seq] += n

    @precondition(lambda self: self.tokens)
    @rule(index=pick, n=st.integers(1, 5))
    def append(self, index, n):
        seq = self._live(index)
        ok = self.alloc.can_append(seq, n)
        self.computed_at[seq] = self.tokens[seq]   # asking moved its windows (vLLM frees before it counts)
        if ok:
            assert self.alloc.append(seq, n) == []
            self._grown(seq, n)
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
        for seq in seqs[:grew]:
            self._grown(seq, 1)
        if grew < len(seqs):
            self.computed_at[seqs[grew]] = self.tokens[seqs[grew]]

    @precondition(lambda self: self.tokens)
    @rule(index=pick)
    def free(self, index):
        seq = self._live(index)
        self.alloc.free(seq)
        del self.tokens[seq], self.computed_at[seq], self.first[seq], self.hit[seq]

    @invariant()
    def agrees_with_the_model(self):
        a = getattr(self, "alloc", None)
        if a is None:
            return
        a.check_invariants()
        bs, used = a.block_size, 0
        for seq, tokens in self.tokens.items():
            tables = a.group_block_tables(seq)
            for spec, table in zip(a.groups, tables):
                if spec.kind == "mamba" and a._cache is not None:      # vLLM's align mode (docstring)
                    c = self.computed_at[seq]
                    assert len(table) == -(-tokens // bs)
                    real = {len(table) - 1} | ({(c - 1) // bs} if c > 0 else set())
                    held = {k for k, b in enumerate(table) if b != NULL_BLOCK}
                    extra = {len(table) - 2} if a.mamba_checkpoints else set()
                    assert real <= held <= real | extra, (table, c, tokens)
                    continue
                assert len(table) == (1 if spec.kind == "mamba" else -(-tokens // bs))
                least = min(model_skipped_blocks(spec, self.computed_at[seq], bs), len(table))
                most = least
                if spec.kind == "chunked" and spec.chunk % bs:            # vLLM's quirk (docstring)
                    most = max(least, self.hit[seq] // bs)
                nulls = table.count(NULL_BLOCK)
                assert least <= nulls <= most and table[:nulls] == [NULL_BLOCK] * nulls
            held = sum(b != NULL_BLOCK for t in tables for b in t)
            used += held
            num_tokens, final = self.first[seq]
            assert held * bs <= a.peak_slots(num_tokens, max(final, tokens)), "peak_slots is not an upper bound"
        assert a.stats().unshared_blocks == used and a.stats().used_blocks <= used

    def teardown(self):
        a = getattr(self, "alloc", None)
        if a is not None:
            for seq in list(self.tokens):
                a.free(seq)
            a.check_invariants()
            assert a.num_free_blocks == a.num_blocks


TestHybrid = HybridMachine.TestCase
# derandomize: the same examples every run, so CI is repeatable. Random exploration (2026-12-01) found
# a chunked group's hit holding more nulls than its length skips; that is vLLM's rule for a chunk that is
# not a multiple of the block size (the module docstring, the test above); 2,400 random examples pass
# since. To explore: derandomize=False.
TestHybrid.settings = settings(**{**examples(max(200, settings.default.max_examples)), "derandomize": True},
                               stateful_step_count=40, deadline=None)


def test_a_chunked_hit_can_null_more_than_it_skips():
    """vLLM 0.33's `find_longest_cache_hit` for full x 2 + chunked 4 at block size 3 (9 blocks), worked by
    hand. Sequence 0 (6 tokens, prefix hashes 100, 101) takes blocks 0-1, 2-3, 4-5 and caches them;
    three appends (9 tokens) drop the chunked group's past chunk (4 and 5 freed, cached) and take 6, 7,
    8; the fourth would need 3 blocks with 2 free. Freed, then sequence 1 (1 token, no hashes) takes the
    three least recently freed blocks, 4, 5 and 6: the chunked group's cached copies of blocks 0 and 1
    are evicted, the full groups' (0, 1 and 2, 3) stay. Sequence 2 (7 tokens, same prefix): the twin
    full groups hit both blocks, a 6-token candidate; the chunked group nulls the blocks before the
    chunk of token 6 (chunk start 4, block 4 // 3 = 1: block 0), then misses block 1: hit 3 tokens,
    chunked table [null], although 3 computed tokens skip no block (3 // 4 x 4 // 3 = 0)."""
    a = HybridAllocator(9, 3, [GroupSpec("full"), GroupSpec("full"), GroupSpec("chunked", chunk=4)],
                        max_model_len=10_000, max_in_flight_tokens=8, prefill_chunk_tokens=8, prefix_caching=True)
    a.allocate(0, 6, 6, [100, 101], hold_tokens=6)
    assert a.group_block_tables(0) == [[0, 1], [2, 3], [4, 5]]
    for _ in range(3):
        a.append(0, 1)
    assert a.group_block_tables(0) == [[0, 1, 6], [2, 3, 7], [NULL_BLOCK, NULL_BLOCK, 8]]
    assert not a.can_append(0, 1)
    a.free(0)
    a.allocate(1, 1, 1, [], hold_tokens=1)
    assert a.group_block_tables(1) == [[4], [5], [6]]
    a.free(1)
    assert a.cached_tokens(7, [100, 101], 2) == 3
    assert a.allocate(2, 7, 7, [100, 101], hold_tokens=3) == 3
    assert a.group_block_tables(2) == [[0], [2], [NULL_BLOCK]]
    a.check_invariants()
