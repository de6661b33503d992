"""The contiguous allocator (Orca / FasterTransformer baselines): one extent per
sequence, placement by first fit or buddy, per-group reservations, lazy decode ticks and their snapshots.

Plain Python (no SimPy); may import `kvsim.alloc.base`, specs and trace only.
"""
