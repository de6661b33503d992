"""The scheduler and its policies: continuous batching (admission, preemption and swap,
lazy decode, beams, samples, request state, batch defaults) and static batching.

Plain Python (no SimPy): the only part of the engine that reaches the allocators; may import alloc,
cost, specs, trace and `kvsim.engine.config` / `step_plan`.
"""
