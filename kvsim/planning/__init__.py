"""Capacity planning on top of `kvsim.simulate`: run flags and flat rows (`runs`), grids of runs on local
processes or Ray (`sweep`, `ray_backend`), static KV capacity (`capacity`), the highest rate under an SLO
and the GPUs for a rate (`rate`), the block-size tuner (`tune`, `bookkeeping`), reports and the paper's
experiments. Imports `trace`, `specs`, `cost`, `alloc` and `engine`; only `cli` and `kvsim` import it.
The public names are re-exported (lazily) by `kvsim`.
"""
