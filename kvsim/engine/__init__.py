"""One serving engine: run configuration (`config`) and the parts built from it (`build`), the
continuous-batching scheduler and its helpers (request state, preemption, beams, samples, lazy decode
and its capped-layer reads, static batching), the SimPy-free step plan (`step`), the SimPy loop
(`loop`, `sim`) and metrics.
Imports `trace`, `specs`, `cost` and `alloc`; only the scheduler and its request state call an
allocator (`build` makes it, `config` names the kinds). Only `loop` and `sim` import SimPy.
"""
