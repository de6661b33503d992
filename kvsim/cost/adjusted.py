"""Calibrated engine profiles: a base profile plus the GPU-side parameters `kvsim calibrate` fits.

A profile file written by `kvsim calibrate` (docs/engine-profiles.md, "Calibrating to measured runs")
may carry, besides the CPU time per step and per sequence:
- `gpu_time_scale`: every step's kernel time (GEMMs, attention, KV writes, all-reduces) multiplied by
  it: 1 is the evidence-based model; 1.25 means the kernels reach 1/1.25 of the modelled efficiency;
- `allreduce_delta_s`: seconds added to each tensor-parallel all-reduce (two per layer per step, none
  at TP 1); negative when the modelled collective latency is too high.
`kvsim.cost.profiles.CalibratedProfile` holds them; `AdjustedCost` applies both around any cost model; the CPU time is added after it by the stepper, so
it is not scaled. Seconds.
"""

from __future__ import annotations

#: A step is never shorter than this after adjustment (seconds): a negative all-reduce delta cannot
#: make time run backwards.
MIN_STEP_S = 1e-6


class AdjustedCost:
    """`base` with step time x `scale` + `add_s` (seconds per step); swaps unchanged."""

    def __init__(self, base, scale: float, add_s: float):
        self.base, self.scale, self.add_s = base, scale, add_s

    def _adj(self, seconds: float) -> float:
        return max(seconds * self.scale + self.add_s, MIN_STEP_S)

    def step_time(self, *args) -> float:
        return self._adj(self.base.step_time(*args))

    def timed_step(self, *args) -> tuple[float, bool]:
        seconds, bound = self.base.timed_step(*args)
        return self._adj(seconds), bound

    def compute_bound(self, *args) -> bool:
        return self.base.compute_bound(*args)

    def decode_step_times(self, seqs: int, first_context: int, steps: int, growth: int | None = None,
                          plus_s: float = 0.0) -> list[float]:
        return [self._adj(t) + plus_s for t in self.base.decode_step_times(seqs, first_context, steps, growth)]

    def swap_time(self, num_tokens: int, num_blocks: int = 0) -> float:
        return self.base.swap_time(num_tokens, num_blocks)


def adjust_cost(cost, profile, deployment):
    """`cost` adjusted by a `CalibratedProfile`'s parameters; `cost` itself for any other profile or
    for the neutral values."""
    scale = getattr(profile, "gpu_time_scale", 1.0)
    delta = getattr(profile, "allreduce_delta_s", 0.0)
    add = 2 * deployment.model.num_layers * delta if deployment.tp > 1 else 0.0
    if scale == 1.0 and add == 0.0:
        return cost
    return AdjustedCost(cost, scale, add)
