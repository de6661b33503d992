"""Jenga's pool layout: each KV cache group keeps its natural page size in bytes, and the pool is cut into
large pages of the least common multiple (LCM) of those page sizes, each split into small pages of one
group when a group takes it (Zhang et al., "Jenga: Effective Memory Management for Serving LLM with
Heterogeneity", SOSP 2025, arXiv 2503.18292, section 4: the LCM allocator).

Units. Sizes are bytes. Memory figures are token slots, as for every kvsim allocator, with one slot =
gcd(page bytes) / block_size bytes (`PoolLayout.unit_bytes` / block_size): a small page of group g is
`units[g]` x block_size slots, where units[g] = page_bytes[g] / gcd, so every count is an integer and
the slots of the pool sum exactly. When every group has the same page size (gpt-oss: 18 full + 18 sliding
layers, equal shapes) a slot is one token of one group, as in the hybrid allocator.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd, lcm
from typing import Sequence

from kvsim.alloc.hybrid import GroupSpec


@dataclass(frozen=True, slots=True)
class JengaGroup:
    """A KV cache group as `hybrid.GroupSpec` (`kind`, `window`, `chunk`, in tokens) plus `page_bytes`: the
    bytes of one page of the group, all its layers together. Attention kinds: K and V of block_size
    tokens for every layer of the group (layers x block_size x 2 x kv_heads x head_dim x dtype bytes);
    Mamba: one request's whole state (conv + SSM) for every layer of the group."""

    kind: str
    window: int = 0
    chunk: int = 0
    page_bytes: int = 0

    def __post_init__(self) -> None:
        GroupSpec(self.kind, self.window, self.chunk)        # the same kind / window / chunk checks
        if not isinstance(self.page_bytes, int) or self.page_bytes < 1:
            raise ValueError(f"a {self.kind} group needs page_bytes >= 1 (bytes of one page), "
                             f"got {self.page_bytes!r}")

    @property
    def spec(self) -> GroupSpec:
        """The group as the hybrid package's rules take it."""
        return GroupSpec(self.kind, self.window, self.chunk)


@dataclass(frozen=True, slots=True)
class PoolLayout:
    """How `pool_bytes` splits: `num_large` large pages of `large_page_bytes` = LCM of the page sizes
    (the rest of the pool, `remainder_bytes`, is never used); a large page taken by group g holds
    `pages_per_large[g]` small pages of `units[g]` x `unit_bytes` bytes."""

    pool_bytes: int
    block_size: int
    unit_bytes: int                    # gcd of the page sizes
    large_page_bytes: int              # lcm of the page sizes
    num_large: int
    pages_per_large: tuple[int, ...]   # per group: large_page_bytes // page_bytes
    units: tuple[int, ...]             # per group: page_bytes // unit_bytes

    @property
    def slots_per_large(self) -> int:
        """Token slots in one large page (large_page_bytes / unit_bytes x block_size)."""
        return self.large_page_bytes // self.unit_bytes * self.block_size

    @property
    def capacity_tokens(self) -> int:
        """Token slots in the usable pool (whole large pages only)."""
        return self.num_large * self.slots_per_large

    @property
    def remainder_bytes(self) -> int:
        """Bytes of the pool past its last whole large page (never used)."""
        return self.pool_bytes - self.num_large * self.large_page_bytes

    @property
    def bytes_per_slot(self) -> float:
        """Bytes of one token slot (unit_bytes / block_size)."""
        return self.unit_bytes / self.block_size


def groups_from_layers(layers: Sequence[tuple[str, int, int]], block_size: int) -> list[JengaGroup]:
    """Jenga's groups for a model given layer by layer as (kind, window or chunk in tokens (0 for full and
    mamba), bytes): bytes are K+V bytes per token of the layer on one GPU for attention kinds (MLA: the
    latent's), the whole state per request for mamba. Layers of the same kind and span share one block
    table, so they make one group whose page is the sum of theirs (block_size tokens each for attention);
    groups in order of first appearance."""
    pages: dict[tuple[str, int], int] = {}
    for kind, span, nbytes in layers:
        if not isinstance(nbytes, int) or nbytes < 1:
            raise ValueError(f"a {kind} layer needs bytes >= 1 (per token, or per request for mamba), got {nbytes!r}")
        key = (kind, span)
        pages[key] = pages.get(key, 0) + (nbytes if kind == "mamba" else nbytes * block_size)
    return [JengaGroup(kind, span if kind == "sliding" else 0, span if kind == "chunked" else 0, page)
            for (kind, span), page in pages.items()]


def plan_pool(pool_bytes: int, block_size: int, groups: Sequence[JengaGroup]) -> PoolLayout:
    """The layout of a `pool_bytes` pool for `groups` with `block_size` tokens per attention page;
    ValueError when not one large page fits (the LCM of the page sizes is larger than the pool)."""
    if not groups or not all(isinstance(g, JengaGroup) for g in groups):
        raise ValueError("groups must be a non-empty sequence of JengaGroup")
    if not isinstance(pool_bytes, int) or pool_bytes < 1 or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"pool_bytes and block_size must be integers >= 1, got {pool_bytes!r} and {block_size!r}")
    sizes = [g.page_bytes for g in groups]
    unit, large = gcd(*sizes), lcm(*sizes)
    if large > pool_bytes:
        raise ValueError(f"the large page (LCM of the page sizes {sizes} = {large} bytes) is larger than the "
                         f"pool ({pool_bytes} bytes): pad the page sizes to a common multiple or give more memory")
    return PoolLayout(pool_bytes, block_size, unit, large, pool_bytes // large,
                      tuple(large // s for s in sizes), tuple(s // unit for s in sizes))
