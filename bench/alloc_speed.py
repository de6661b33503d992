"""Covers: the allocator hot paths the engine calls every step (can_append + append per running
sequence, stats() once per step).
Scenario: a paged pool (block size 16) with 200 live sequences decoding one token per step: first the
allocator calls alone, then an engine-like loop where a finished sequence is freed and replaced by a
new one (blocks churn), timing stats() once per step apart. Prints appends/s and stats()/s.

Run: .venv/bin/python bench/alloc_speed.py [--appends 3000000] [--fork]
"""

from __future__ import annotations

import argparse
import random
import time

from kvsim.alloc import PagedAllocator


def run(num_appends: int, num_seqs: int, fork: bool, seed: int = 0) -> None:
    rng = random.Random(seed)
    alloc = PagedAllocator(num_blocks=num_seqs * 2048 // 16, block_size=16)
    remaining: dict[int, int] = {}
    next_id = 0

    def admit() -> None:
        nonlocal next_id
        prompt, output = rng.randint(16, 512), rng.randint(64, 1024)
        alloc.allocate(next_id, prompt, prompt + output - 1)
        remaining[next_id] = output - 1
        if fork:                       # a parallel sample sharing the prompt
            alloc.fork(next_id, next_id + 1)
            remaining[next_id + 1] = output - 1
            next_id += 1
        next_id += 1

    while len(remaining) < num_seqs:
        admit()
    appends = steps = 0
    stats_s = 0.0
    start = time.perf_counter()
    while appends < num_appends:
        for seq_id in list(remaining):
            if alloc.can_append(seq_id):
                alloc.append(seq_id)
                appends += 1
                remaining[seq_id] -= 1
                if remaining[seq_id] == 0:
                    del remaining[seq_id]
                    alloc.free(seq_id)
        while len(remaining) < num_seqs:
            admit()
        t = time.perf_counter()
        alloc.stats()
        stats_s += time.perf_counter() - t
        steps += 1
    total_s = time.perf_counter() - start
    loop_s = total_s - stats_s
    print(f"paged, {num_seqs} live sequences{' (forked pairs, shared prompts)' if fork else ''}: "
          f"{appends:,} can_append+append in {loop_s:.2f} s = {appends / loop_s / 1e6:.2f} M appends/s "
          f"(incl. loop, admission, free); {steps:,} stats() = {steps / stats_s / 1e3:.1f} k stats/s")


def tight(num_appends: int, num_seqs: int) -> None:
    """The allocator calls alone: `can_append` + `append` over `num_seqs` long sequences."""
    steps = num_appends // num_seqs
    alloc = PagedAllocator(num_blocks=num_seqs * (steps + 200) // 16 + num_seqs, block_size=16)
    ids = list(range(num_seqs))
    for seq_id in ids:
        alloc.allocate(seq_id, 100, 100 + steps)
    can_append, append = alloc.can_append, alloc.append
    start = time.perf_counter()
    for _ in range(steps):
        for seq_id in ids:
            if can_append(seq_id):
                append(seq_id)
    total_s = time.perf_counter() - start
    print(f"paged, tight loop of can_append+append only: {steps * num_seqs / total_s / 1e6:.2f} M appends/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--appends", type=int, default=3_000_000)
    parser.add_argument("--seqs", type=int, default=200)
    parser.add_argument("--fork", action="store_true", help="also run with forked pairs (shared blocks)")
    args = parser.parse_args()
    tight(args.appends, args.seqs)
    run(args.appends, args.seqs, fork=False)
    if args.fork:
        run(args.appends, args.seqs, fork=True)


if __name__ == "__main__":
    main()
