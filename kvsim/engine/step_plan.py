"""What one engine step does (`StepPlan`), and the memory record it carries (`MemoryRecord`): the plain
records `kvsim.engine.step` hands the engine and the GPU harness replay. SimPy-free.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


class MemoryRecord(Protocol):
    """KV memory while a step runs, as the scheduler hands it over: the engine's own view of it, so that
    nothing here imports an allocator (the allocators' `MemoryStats` named tuple is one). Token slots;
    the five categories sum to `capacity_tokens`; blocks in the allocator's blocks (contiguous: slots)."""

    capacity_tokens: int
    token_states: int
    reserved: int
    internal_fragmentation: int
    external_fragmentation: int
    free: int
    used_blocks: int
    free_blocks: int
    unshared_blocks: int        # blocks the live sequences would hold without sharing
    cached_blocks: int          # free blocks still holding reusable prefix-cache contents


@dataclass(slots=True, init=False)
class StepPlan:
    """One engine step (or a window of decode steps of the same batch: its token counts are its first
    step's; each later step reads `decode_seqs` more context tokens). Requests are trace indices;
    sequences and blocks are ids as the allocator knows them; memory in token slots. Made every step:
    `__init__` sets every field in one assignment (each plan its own lists), then the named ones, in
    about half the dataclass's own `__init__`'s steps."""

    # what runs
    prefills: list[tuple[int, int]] = field(default_factory=list)  # (request, tokens computed)
    prefill_tokens: int = 0
    prefill_attn_tokens: int = 0      # sum of chunk x context-after-chunk
    decodes: list[int] = field(default_factory=list)                # requests decoding one token
    decode_seqs: int = 0
    decode_context_tokens: int = 0    # KV tokens the decodes read, the new ones included
    swap_tokens: int = 0              # KV slots moved over PCIe this step (either way)
    swap_blocks: int = 0              # contiguous pieces they move in (paged: blocks; contiguous: sequences)
    batch_requests: int = 0           # running requests
    # allocator calls, in order (made while scheduling, before the step's K/V writes)
    allocated: list[tuple[int, int]] = field(default_factory=list)  # (seq, prefix-cache hit tokens)
    forked: list[tuple[int, int]] = field(default_factory=list)     # (parent seq, child seq)
    copies: list[tuple[int, int]] = field(default_factory=list)     # copy-on-write (src, dst) blocks
    reforked: list[tuple[int, int]] = field(default_factory=list)   # beams: (parent seq, replaced seq)
    copied_slots: int = 0             # KV slots the refork copied (contiguous memory; paged: 0)
    freed: list[int] = field(default_factory=list)                  # seqs freed by preemption
    preempted: list[int] = field(default_factory=list)              # requests
    swapped_out: list[int] = field(default_factory=list)            # requests (of `preempted`)
    swapped_in: list[int] = field(default_factory=list)             # requests (also in `decodes`)
    limited_by: int = 0               # why requests still wait after it (LIMITS index; 0: none)
    recomputed_tokens: int = 0        # computed tokens dropped by recompute preemptions this step
    swap_fallbacks: int = 0           # swaps refused for want of CPU swap space (recomputed instead)
    finished: list[int] = field(default_factory=list)               # retired after the step, seqs freed
    samples_ended: list[int] = field(default_factory=list)          # seqs of samples that ended, freed
    # time and memory: one entry per step (a window has several)
    starts: list[float] = field(default_factory=list)               # s
    durations: list[float] = field(default_factory=list)            # s
    waiting: list[int] = field(default_factory=list)                # queued requests at each start
    memory: list[MemoryRecord] = field(default_factory=list)        # while the step runs
    compute_bound: list[bool] = field(default_factory=list)         # kernels compute- (not memory-) bound
    tables: dict[int, list[int]] | None = None   # live seq -> block ids during the step (on request)
    group_tables: dict[int, list[list[int]]] | None = None   # live seq -> one table per KV cache group

    def __init__(self, **values) -> None:
        """The fields given by name; the rest their defaults (TypeError naming an unknown one)."""
        (self.prefills, self.prefill_tokens, self.prefill_attn_tokens, self.decodes, self.decode_seqs,
         self.decode_context_tokens, self.swap_tokens, self.swap_blocks, self.batch_requests, self.allocated,
         self.forked, self.copies, self.reforked, self.copied_slots, self.freed, self.preempted,
         self.swapped_out, self.swapped_in, self.limited_by, self.recomputed_tokens, self.swap_fallbacks,
         self.finished, self.samples_ended, self.starts, self.durations, self.waiting, self.memory,
         self.compute_bound, self.tables, self.group_tables) = (
            [], 0, 0, [], 0, 0, 0, 0, 0, [], [], [], [], 0, [], [], [], [], 0, 0, 0, [], [], [], [], [], [], [],
            None, None)
        for name, value in values.items():
            try:
                setattr(self, name, value)
            except AttributeError:
                raise TypeError(f"StepPlan has no field {name!r}") from None

    @property
    def num_steps(self) -> int:
        return len(self.starts)

    @property
    def end_s(self) -> float:
        """When the (last) step ends, s."""
        return self.starts[-1] + self.durations[-1]

