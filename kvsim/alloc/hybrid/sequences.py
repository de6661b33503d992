"""What the hybrid allocator and Jenga's share about their sequences: one sequence per request (no
forks), one block table per KV cache group, lookups by id, and the per-group memory record the engine
asks for. A mixin of both (`kvsim.alloc.hybrid.HybridAllocator`, `kvsim.alloc.jenga.JengaAllocator`),
which keep `_seqs` (id -> a sequence with `tables` and `tokens`) and `prefill_chunk_tokens`.
"""

from __future__ import annotations

from kvsim.alloc.base import AllocationError


class GroupedSequences:
    """Lookups, block tables and the refusals of forking that both group allocators answer alike;
    `_kind` names the allocator in messages."""

    _kind = "hybrid"

    #: True: `stats()` also carries each group's (or group spec's) parts (`kvsim.alloc.base.grouped_record`),
    #: for the engine's per-kind time averages (set by `kvsim.engine.build`); False: a plain MemoryStats.
    record_groups = False

    def _seq(self, seq_id: int):
        try:
            return self._seqs[seq_id]
        except KeyError:
            raise AllocationError(f"unknown sequence id {seq_id}") from None

    def block_table(self, seq_id: int) -> list[int]:
        """A copy of `seq_id`'s first group's block table (`NULL_BLOCK` = -1 for skipped entries)."""
        return list(self._seq(seq_id).tables[0])

    def group_block_tables(self, seq_id: int) -> list[list[int]]:
        """Copies of `seq_id`'s block tables, one per group in group order (-1: a skipped entry)."""
        return [list(t) for t in self._seq(seq_id).tables]

    def num_tokens(self, seq_id: int) -> int:
        """Tokens `seq_id` holds written."""
        return self._seq(seq_id).tokens

    def _first(self, num_tokens: int) -> int:
        """Tokens a new sequence of `num_tokens` takes at its first allocation (one prefill chunk)."""
        chunk = self.prefill_chunk_tokens
        return num_tokens if chunk is None else min(num_tokens, chunk)

    def _admit(self, seq_id: int, num_tokens: int, block_hashes, hold_tokens: int | None):
        """`allocate`'s common start: (prefix-cache hit tokens, hit tables or None without caching, tokens to
        hold now: `hold_tokens`, default `num_tokens`, at least the hits); AllocationError for a live id or
        a hold outside 1..num_tokens."""
        if seq_id in self._seqs:
            raise AllocationError(f"sequence id {seq_id} is already allocated")
        hit, hits = (0, None) if self._cache is None else self.find_hits(num_tokens, block_hashes, seq_id)
        hold = max(num_tokens if hold_tokens is None else hold_tokens, hit)
        if not 1 <= hold <= num_tokens:
            raise AllocationError(f"sequence {seq_id}: hold_tokens {hold_tokens} outside 1..{num_tokens}")
        return hit, hits, hold

    def _one_sequence(self, num_seqs: int) -> None:
        """ValueError unless a request has one sequence."""
        if num_seqs != 1:
            raise ValueError(f"the {self._kind} allocator serves one sequence per request, got {num_seqs} "
                             f"(parallel samples / beam search are not supported)")

    def can_fork(self, parent_id: int) -> bool:
        """False: one sequence per request."""
        return False

    def fork(self, parent_id: int, child_id: int) -> None:
        raise ValueError(f"the {self._kind} allocator does not fork sequences (parallel samples / beam search)")

    def refork(self, parent_id: int, child_id: int) -> int:
        raise ValueError(f"the {self._kind} allocator does not fork sequences (parallel samples / beam search)")
