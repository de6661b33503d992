"""Capacity planning on top of `kvsim.simulate`: run flags and flat rows (`runs`), grids of runs on local
processes or Ray (`sweep`), static KV capacity (`capacity`), the highest rate under an SLO and the GPUs
for a rate (`rate`). The public names are re-exported (lazily) by `kvsim`.
"""
