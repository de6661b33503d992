"""The paged allocator (vLLM's block manager): blocks, the free list, the prefix cache,
append and copy-on-write, lazy decode windows and their snapshots.

Plain Python (no SimPy); may import `kvsim.alloc.base`, `kvsim.alloc.cpu_tier`, specs and trace only.
"""
