"""Time the per-step bookkeeping of paged KV on the machine at hand: building padded block tables from
Python lists, turning them into an int32 tensor on the device (the host-to-device copy), and allocating
and freeing blocks with kvsim's paged allocator. Writes a `kvsim-bookkeeping/1` file for
`kvsim tune-block-size --bookkeeping`. Needs torch; imports only SimPy-free kvsim modules.
"""

from __future__ import annotations

import time
from dataclasses import replace

from kvsim.planning.bookkeeping import Bookkeeping, measure

#: (sequences, blocks per sequence) of the two table sizes timed; the copy's fixed and per-entry costs
#: are the intercept and slope between them.
SMALL, LARGE = (8, 8), (256, 128)


def _best(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def time_bookkeeping(device: str, repeats: int = 20) -> Bookkeeping:
    """Measured constants on `device` ('cuda' or 'cpu'); seconds per entry, per block, per copy."""
    import torch

    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)

    def copy(shape):
        seqs, blocks = shape
        tables = [list(range(blocks)) for _ in range(seqs)]

        def run():
            torch.tensor(tables, dtype=torch.int32, device=device)
            sync()
        return _best(run, repeats)

    small, large = copy(SMALL), copy(LARGE)
    n_small, n_large = SMALL[0] * SMALL[1], LARGE[0] * LARGE[1]
    per_entry = max((large - small) / (n_large - n_small), 1e-12)
    fixed = max(small - per_entry * n_small, 0.0)
    cpu = measure()
    name = torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"
    return replace(cpu, copy_fixed_s=fixed, copy_bytes_per_s=4 / per_entry,
                   source=f"gpu_harness.bookkeeping on {device} ({name})")
