"""Beam search as a seeded model of which beams survive each decode step. Plain Python, no SimPy.

Real beam search keeps, at every decode step, the k best of the candidates its k beams propose, so a
beam with no candidate among the k best dies and a beam with several has forks that take the dead
beams' places: the k beams then share the whole history of their common ancestor. kvsim does not
model token probabilities, only that outcome:

- at each decode step of a request with k > 1 beams, from its second generated token on (the first
  decode step's k beams all continue the prompt, so nothing differs yet), each beam independently
  dies with probability `death_rate`; if every beam would die, the one with the highest draw survives;
- each dead beam, in beam order, is replaced by a fork of a surviving beam chosen uniformly at random
  (survivors may get several forks, as the best beams do);
- the draws come from one `random.Random` per request, seeded by the run's seed and the request's
  index, so a run is deterministic for its seed and a request's beams do not depend on the others.

The memory consequences (paged: the replaced beam drops its blocks, freeing those no one else holds,
and shares all of the parent's, copying the shared partly filled last block on its next write;
contiguous: the parent's slots are copied into the dead beam's own reservation) are the allocator's
(`refork`); the scheduler applies them (`SchedulerBase._beam_step`).
"""

from __future__ import annotations

import random

#: Default probability per decode step that a beam dies (replaced by a fork of a survivor); see
#: docs/sharing.md for why this value.
BEAM_DEATH_RATE = 0.05


class BeamModel:
    """Which beams die and which survivors replace them, per request and decode step."""

    def __init__(self, death_rate: float, seed: int) -> None:
        """`death_rate`: probability in (0, 1) that a beam dies at a decode step; `seed`: the run's."""
        if not 0 < death_rate < 1:
            raise ValueError(f"beam death rate must be in (0, 1), got {death_rate}")
        self.death_rate = death_rate
        self.seed = seed
        self._rngs: dict[int, random.Random] = {}

    def replacements(self, request: int, k: int) -> list[tuple[int, int]]:
        """(surviving parent beam, replaced beam) pairs, beams numbered 0..k-1, for one decode step
        of request `request` with `k` beams; [] when none dies."""
        rng = self._rngs.get(request)
        if rng is None:
            rng = self._rngs[request] = random.Random(f"kvsim-beam:{self.seed}:{request}")
        draws = [rng.random() for _ in range(k)]
        dead = [b for b, u in enumerate(draws) if u < self.death_rate]
        if not dead:
            return []
        if len(dead) == k:
            dead.remove(max(range(k), key=draws.__getitem__))
        alive = [b for b in range(k) if b not in dead]
        return [(alive[rng.randrange(len(alive))], b) for b in dead]

    def forget(self, request: int) -> None:
        """Drop a finished request's random stream (memory stays bounded by the running requests)."""
        self._rngs.pop(request, None)
