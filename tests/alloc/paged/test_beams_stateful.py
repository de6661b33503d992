"""Hypothesis state machine for beam search on the paged allocator: beam groups are admitted (a prompt
plus forks), decode together (batched appends), dead beams are replaced by forks of survivors
(`refork`) and beams finish, in random order. A model of the physical pool (every slot's content)
checks that no shared block is ever written in place, that copy-on-write copies what the readers
need, that every live beam reads its own history through its block table, and that nothing leaks."""

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvsim.alloc import PagedAllocator

from tests.quick_examples import examples

pick = st.integers(0, 10_000)


class BeamMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.alloc = None
        self.groups: dict[int, list[int]] = {}    # group -> its live beams (sequence ids)
        self.content: dict[int, list[int]] = {}   # model: seq -> token contents in order
        self.pool: dict[int, list] = {}           # physical model: block -> slot contents
        self.next_id = self.next_token = 0

    @initialize(num_blocks=st.integers(3, 30), block_size=st.sampled_from([1, 2, 4, 8]))
    def build(self, num_blocks, block_size):
        self.alloc = PagedAllocator(num_blocks, block_size)
        self.bs = block_size

    def _holders(self, block):
        return sum(self.alloc.block_table(s).count(block) for s in self.content)

    def _write(self, seq, token):
        """The kernel's write of `seq`'s next token: only into a block no one else holds."""
        pos = len(self.content[seq])
        block = self.alloc.block_table(seq)[pos // self.bs]
        assert self._holders(block) == 1, f"seq {seq} writes into block {block}, shared"
        self.pool.setdefault(block, [None] * self.bs)[pos % self.bs] = token
        self.content[seq].append(token)

    def _token(self):
        self.next_token += 1
        return self.next_token

    @rule(prompt=st.integers(1, 20), beams=st.integers(1, 4))
    def admit(self, prompt, beams):
        if not self.alloc.can_allocate(prompt, prompt + 10):
            return
        first = self.next_id
        self.alloc.allocate(first, prompt, prompt + 10)
        self.content[first] = []
        for _ in range(prompt):
            self._write(first, self._token())
        seqs = [first]
        for k in range(1, beams):
            self.alloc.fork(first, first + k)
            self.content[first + k] = list(self.content[first])
            seqs.append(first + k)
        self.next_id += beams
        self.groups[first] = seqs

    @precondition(lambda self: self.content)
    @rule(data=st.data())
    def decode(self, data):
        """One batched decode step over some live beams: copies first, then each beam's new token."""
        live = sorted(self.content)
        seqs = data.draw(st.lists(st.sampled_from(live), unique=True, min_size=1, max_size=8))
        copies = []
        grown = self.alloc.append_each(seqs, 0, copies)
        for src, dst in copies:
            event("copy-on-write")
            self.pool[dst] = list(self.pool[src])
        for seq in seqs[:grown]:          # the allocator counts the new slot; the step writes it
            assert self.alloc.num_tokens(seq) == len(self.content[seq]) + 1
            self._write(seq, self._token())

    @precondition(lambda self: any(len(g) > 1 for g in self.groups.values()))
    @rule(g=pick, a=pick, b=pick)
    def refork(self, g, a, b):
        """A beam dies and is replaced by a fork of another beam of its group."""
        groups = [seqs for seqs in self.groups.values() if len(seqs) > 1]
        seqs = groups[g % len(groups)]
        parent = seqs[a % len(seqs)]
        child = seqs[(a + 1 + b % (len(seqs) - 1)) % len(seqs)]
        assert parent != child
        free_before = self.alloc.num_free_blocks
        only_child = [x for x in self.alloc.block_table(child) if self._holders(x) == 1]
        assert self.alloc.refork(parent, child) == 0
        self.content[child] = list(self.content[parent])
        assert self.alloc.block_table(child) == self.alloc.block_table(parent)
        assert self.alloc.num_free_blocks == free_before + len(only_child), "unshared blocks not freed at once"
        event("refork")

    @precondition(lambda self: self.content)
    @rule(index=pick)
    def finish_beam(self, index):
        seq = sorted(self.content)[index % len(self.content)]
        self.alloc.free(seq)
        del self.content[seq]
        for key, seqs in list(self.groups.items()):
            if seq in seqs:
                seqs.remove(seq)
                if not seqs:
                    del self.groups[key]

    @invariant()
    def every_beam_reads_its_history(self):
        if self.alloc is None:
            return
        self.alloc.check_invariants()
        for seq, tokens in self.content.items():
            table = self.alloc.block_table(seq)
            assert len(table) == -(-len(tokens) // self.bs)
            read = [self.pool[table[p // self.bs]][p % self.bs] for p in range(len(tokens))]
            assert read == tokens, f"seq {seq} reads {read}, wrote {tokens}"
        used = {b for s in self.content for b in self.alloc.block_table(s)}
        assert self.alloc.stats().used_blocks == len(used)

    def teardown(self):
        if self.alloc is None:
            return
        for seq in list(self.content):
            self.alloc.free(seq)
        self.alloc.check_invariants()
        assert self.alloc.stats().used_blocks == 0 and self.alloc.num_free_blocks == self.alloc.num_blocks


TestBeams = BeamMachine.TestCase
TestBeams.settings = settings(**examples(max(100, settings.default.max_examples)),
                              stateful_step_count=40, deadline=None)
