"""One KV cache group of a hybrid model and the rules its kind follows (vLLM 0.33's single-type managers).

A group's rules answer the same few questions for every kind, in blocks of `block_size` token slots:
how many block-table entries hold a sequence of N tokens (`entries_for`), how many leading entries are
no longer read once C tokens are computed and may be freed (`skipped_entries`; `next_take` and
`next_drop` say at which C the next change comes, for the decode fast paths), how many blocks the
admission gate asks of a whole sequence (`admission_blocks`, the per-request cap of a recycling
kind), how many it can hold at once at most (`peak_blocks`) and the longest prefix-cache hit the kind
can serve (`find_hit`: full attention every block from the start, a sliding window its last
cdiv(W - 1, block_size) blocks, a chunked group its current chunk's). Sources, all in vLLM 0.33:
- `vllm/v1/core/single_type_kv_cache_manager.py`: `get_num_blocks_to_allocate` (cdiv(tokens,
  block_size) entries, the admission cap), `remove_skipped_blocks` (leading whole blocks skipped),
  `SlidingWindowManager.get_num_skipped_tokens` (max(0, C - W + 1)),
  `ChunkedLocalAttentionManager.get_num_skipped_tokens` (C // chunk * chunk), `MambaManager` (without
  prefix caching its block holds `max_model_len` tokens: one state block per request, never skipped),
  `FullAttentionManager` / `SlidingWindowManager` / `ChunkedLocalAttentionManager.find_longest_cache_hit`;
- `vllm/v1/kv_cache_interface.py`: `SlidingWindowSpec.max_admission_blocks_per_request`
  (cdiv(min(W - 1 + in_flight, max_model_len), block_size) + 1) and
  `ChunkedLocalAttentionSpec.max_admission_blocks_per_request` (cdiv(min(chunk + in_flight,
  max_model_len), block_size)), where in_flight is `VllmConfig.max_in_flight_tokens` (concurrent
  batches x max_num_batched_tokens).
MLA is paged like full attention: kind "full" here.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("full", "sliding", "chunked", "mamba")
NULL_BLOCK = -1     # a block-table entry skipped by its window (vLLM's null block): it holds no block
NEVER = 1 << 62     # a token count no sequence reaches


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """A KV cache group: `kind` in KINDS, `window` (tokens; sliding only), `chunk` (tokens; chunked only)."""

    kind: str
    window: int = 0
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"group kind {self.kind!r} unknown; known: {', '.join(KINDS)}")
        if self.kind == "sliding" and self.window < 1:
            raise ValueError(f"a sliding group needs window >= 1 token, got {self.window}")
        if self.kind == "chunked" and self.chunk < 1:
            raise ValueError(f"a chunked group needs chunk >= 1 token, got {self.chunk}")
        if self.kind != "sliding" and self.window:
            raise ValueError(f"window={self.window} given for a {self.kind} group (sliding only)")
        if self.kind != "chunked" and self.chunk:
            raise ValueError(f"chunk={self.chunk} given for a {self.kind} group (chunked only)")


class FullRules:
    """Full attention (and MLA): every token's block is kept until the sequence is freed."""

    state_block = False      # True: its blocks' slots all count as state (Mamba)
    takes = True             # False: its table never grows (Mamba without prefix caching)
    one_block = False        # True: a growth takes one block, at its last entry, nulls before it

    def __init__(self, block_size: int, cap_blocks: int | None = None) -> None:
        self.block_size = block_size
        self.cap_blocks = cap_blocks          # per-request admission cap (recycling kinds), None: none

    def entries_for(self, num_tokens: int) -> int:
        """Block-table entries (null ones included) that hold `num_tokens` tokens."""
        return -(-num_tokens // self.block_size)

    def skipped_entries(self, computed: int) -> int:
        """Leading entries no token after the first `computed` ones reads (freed as decoding goes on)."""
        return 0

    def most_nulls(self, tokens: int) -> int:
        """The most leading null entries a sequence of `tokens` tokens can hold: its skipped entries
        (a chunked group's prefix-cache hit can null more, `ChunkedRules.most_nulls`)."""
        return self.skipped_entries(tokens)

    def next_take(self, entries: int) -> int:
        """The computed tokens C at which growing to C + 1 needs entry `entries + 1`."""
        return entries * self.block_size

    def next_drop(self, nulls: int) -> int:
        """The least computed tokens C at which more than `nulls` leading entries are skipped."""
        return NEVER

    def admission_blocks(self, num_tokens: int) -> int:
        """Blocks vLLM's full-sequence admission gate counts for a new sequence of `num_tokens`."""
        need = self.entries_for(num_tokens)
        return need if self.cap_blocks is None or need < self.cap_blocks else self.cap_blocks

    def find_hit(self, lookup, max_length: int) -> tuple[list, int]:
        """The longest prefix of at most `max_length` tokens this kind can serve from the prefix cache:
        (per block index: what `lookup(k)` gave, or NULL_BLOCK where the window needs nothing; hit
        tokens). `lookup(k)`: the cached blocks of block k, or None (vLLM's `find_longest_cache_hit`):
        full attention needs every block from the start."""
        hits = []
        for k in range(max_length // self.block_size):
            found = lookup(k)
            if found is None:
                break
            hits.append(found)
        return hits, len(hits) * self.block_size

    def peak_blocks(self, num_tokens: int, final_tokens: int, first_tokens: int) -> int:
        """Most blocks a sequence admitted with `num_tokens`, `first_tokens` of them allocated at once
        (the first prefill chunk), holds at any time while growing one chunk or token at a time to
        `final_tokens`: an upper bound for recycling kinds (their admission cap, or the first chunk)."""
        return self.entries_for(max(num_tokens, final_tokens))


class SlidingRules(FullRules):
    """Sliding window of `window` tokens: the token after C computed ones reads the last window - 1 of
    them, so whole blocks before token C - window + 1 are skipped."""

    def __init__(self, block_size: int, window: int, cap_blocks: int) -> None:
        super().__init__(block_size, cap_blocks)
        self.window = window

    def skipped_entries(self, computed: int) -> int:
        skipped = computed - self.window + 1
        return skipped // self.block_size if skipped > 0 else 0

    def next_drop(self, nulls: int) -> int:
        return (nulls + 1) * self.block_size + self.window - 1

    def find_hit(self, lookup, max_length: int) -> tuple[list, int]:
        """A run of cdiv(window - 1, block_size) cached blocks ending as late as possible (the window
        of the next token), nulls before it; or a shorter run from the first block."""
        need = -(-(self.window - 1) // self.block_size)
        run: list = []
        for k in range(max_length // self.block_size - 1, -1, -1):
            found = lookup(k)
            if found is None:
                run = []
                continue
            run.insert(0, found)
            if len(run) >= need:
                return [NULL_BLOCK] * k + run, (k + len(run)) * self.block_size
        return run, len(run) * self.block_size      # (the loop ended on the run from block 0, if any)

    def peak_blocks(self, num_tokens: int, final_tokens: int, first_tokens: int) -> int:
        most = max(self.cap_blocks, self.entries_for(first_tokens))
        return min(self.entries_for(max(num_tokens, final_tokens)), most)


class ChunkedRules(SlidingRules):
    """Chunked local attention of `chunk` tokens: a token reads only its own chunk, so the blocks of
    past chunks are skipped."""

    def __init__(self, block_size: int, chunk: int, cap_blocks: int) -> None:
        FullRules.__init__(self, block_size, cap_blocks)
        self.chunk = chunk

    def skipped_entries(self, computed: int) -> int:
        return computed // self.chunk * self.chunk // self.block_size

    def most_nulls(self, tokens: int) -> int:
        """With a chunk that is not a multiple of the block size, a hit can hold more nulls than its
        length skips, as in vLLM 0.33: `find_hit` nulls the blocks before the chunk of the candidate
        length L (the full groups' hit), up to the block holding the chunk's start, then cuts the hit
        where the chunk's own blocks miss. E.g. chunk 4, block 3, L = 6: [null], hit 3 tokens, although
        3 tokens skip no block (`ChunkedLocalAttentionManager.find_longest_cache_hit`). Such a hit is at
        most as long as the tokens held, all nulls."""
        skipped = self.skipped_entries(tokens)
        return skipped if self.chunk % self.block_size == 0 else max(skipped, tokens // self.block_size)

    def next_drop(self, nulls: int) -> int:
        return -(-(nulls + 1) * self.block_size // self.chunk) * self.chunk

    def find_hit(self, lookup, max_length: int) -> tuple[list, int]:
        """Nulls for the chunks before the next token's, then cached blocks of its chunk from its start."""
        start = max_length // self.chunk * self.chunk // self.block_size
        hits: list = [NULL_BLOCK] * start
        for k in range(start, max_length // self.block_size):
            found = lookup(k)
            if found is None:
                break
            hits.append(found)
        return hits, len(hits) * self.block_size


class MambaRules(FullRules):
    """Mamba / linear attention: one state block per sequence, whatever its length."""

    state_block = True
    takes = False

    def entries_for(self, num_tokens: int) -> int:
        return 1

    def next_take(self, entries: int) -> int:
        return NEVER

    def peak_blocks(self, num_tokens: int, final_tokens: int, first_tokens: int) -> int:
        return 1


class MambaAlignRules(FullRules):
    """Mamba with prefix caching: vLLM 0.33's "align" cache mode (`MambaManager`, mamba_cache_mode
    "align", blocks of block_size tokens). The table is positional, cdiv(C, block_size) entries, entry k
    the state after (k + 1) x block_size tokens; a sequence holds only its running state block (the one
    of its last computed token: `get_num_skipped_tokens` = C - 1, whole blocks before it freed) and, for
    the step that crosses a block boundary, the new one: a growth takes ONE block at the last entry,
    nulls between (`allocate_new_blocks`; `one_block`), and asks the free pool for at most one
    (`get_num_blocks_to_allocate`'s physical cap, also at admission). A hit is the latest cached state
    at or before the candidate length, searched right to left (`find_longest_cache_hit`)."""

    state_block = True
    one_block = True
    window = 2          # (its skip, (C - 1) // block_size, is a sliding window of 2 tokens': ticks.py)

    def __init__(self, block_size: int, checkpoints: bool = False) -> None:
        super().__init__(block_size)
        self.peak = 3 if checkpoints else 2     # (a prefill checkpoint: one more beside the two states)

    def skipped_entries(self, computed: int) -> int:
        return (computed - 1) // self.block_size if computed > 0 else 0

    def most_nulls(self, tokens: int) -> int:
        return self.entries_for(tokens) - 1

    def next_drop(self, nulls: int) -> int:
        return (nulls + 1) * self.block_size + 1

    def find_hit(self, lookup, max_length: int) -> tuple[list, int]:
        for k in range(max_length // self.block_size - 1, -1, -1):
            found = lookup(k)
            if found is not None:
                return [NULL_BLOCK] * k + [found], (k + 1) * self.block_size
        return [], 0

    def peak_blocks(self, num_tokens: int, final_tokens: int, first_tokens: int) -> int:
        return self.peak


def make_rules(spec: GroupSpec, block_size: int, max_model_len: int, max_in_flight_tokens: int,
               align: bool = False, checkpoints: bool = False) -> FullRules:
    """The rules of group `spec`, with vLLM's per-request admission cap for the recycling kinds; `align`:
    a Mamba group in vLLM's "align" cache mode (prefix caching on), `checkpoints` with prefill
    checkpoint blocks (kvsim/alloc/hybrid/mamba.py)."""
    cdiv = lambda a: -(-a // block_size)   # noqa: E731
    if spec.kind == "sliding":
        cap = cdiv(min(spec.window - 1 + max_in_flight_tokens, max_model_len)) + 1
        return SlidingRules(block_size, spec.window, cap)
    if spec.kind == "chunked":
        return ChunkedRules(block_size, spec.chunk, cdiv(min(spec.chunk + max_in_flight_tokens, max_model_len)))
    if spec.kind == "mamba":
        return MambaAlignRules(block_size, checkpoints) if align else MambaRules(block_size)
    return FullRules(block_size)
