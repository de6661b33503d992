"""Content ids of shared prompt blocks: deterministic 63-bit ids, equal exactly when two blocks at the same
position hold the same tokens (the allocator chains them into prefix-cache keys itself).

A trace gives shared prefixes either as per-block hashes (possibly of bigger blocks than the run's, as
Mooncake's 512-token `hash_ids`: `split_block_ids`) or as a named prefix group (`group_block_ids`).
"""

from __future__ import annotations

import hashlib

import numpy as np

_MASK63 = np.uint64((1 << 63) - 1)
_SALT_HASH = np.uint64(0x5EED_0000_0000_0001)  # keeps split-hash ids apart from group ids


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on a uint64 array (wrapping arithmetic); result fits in 63 bits."""
    x = x.astype(np.uint64, copy=True)
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x & _MASK63


def _group_key(name: str) -> np.uint64:
    """A stable 64-bit key for a prefix-group name (blake2b, not Python's salted `hash`)."""
    return np.frombuffer(hashlib.blake2b(name.encode(), digest_size=8).digest(), dtype=np.uint64)[0]


def split_block_ids(hashes: np.ndarray, ratio: int, count: int) -> list[int]:
    """Ids of the first `count` blocks when each of `hashes` (int64) covers `ratio` run blocks; the ids
    differ per sub-block, per hash and per ratio."""
    count = min(count, len(hashes) * ratio)
    sub = np.arange(count, dtype=np.uint64)
    salt = _SALT_HASH ^ np.uint64(ratio << 48)  # sub-block k covers a different span per ratio
    keys = _mix64(hashes.view(np.uint64)[sub // np.uint64(ratio)] ^ salt)
    return _mix64(keys + sub % np.uint64(ratio)).tolist()


def group_block_ids(name: str, count: int) -> list[int]:
    """Ids of the first `count` blocks of prefix group `name`."""
    key = _group_key(name)
    return _mix64(np.full(count, key, dtype=np.uint64) + np.arange(count, dtype=np.uint64)).tolist()
