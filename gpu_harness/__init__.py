"""GPU side of kvsim: Triton KV-cache kernels, torch references, correctness check and calibration.

torch and triton are imported lazily (through `gpu_harness.backend`), so `kvsim --help` works without
them. Nothing here imports simpy: the harness must run on GPU machines that have only the `gpu` extra.
"""
