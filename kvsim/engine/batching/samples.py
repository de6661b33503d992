"""Independent sample lengths: when each of a request's n parallel samples stops. Plain Python.

vLLM's benchmarks run every sample to `max_tokens` (`ignore_eos`), which is what a trace's single
`output_tokens` describes and kvsim's default (`equal`). In production each sample stops at its own
end-of-sequence token, so a request's samples have different lengths; it finishes when its longest
does, and each shorter sample frees its blocks (those it does not share) as soon as it ends.

- `output_tokens_per_sample` in a trace gives request i's n lengths exactly (the largest equal to its
  `output_tokens`); it wins over the mode.
- `--sample-lengths uniform`: the trace's `output_tokens` M is the longest sample's length (so the
  request ends when the trace says); each of the other n - 1 samples draws its length uniformly from
  1..M (all that is known about them is that they are no longer than M), from one random stream per
  request seeded by the run's seed and the request's index.
- `equal`: every sample runs to M.
Beams (`beam_width` > 1) always run to M (`kvsim.engine.batching.beams`).
"""

from __future__ import annotations

import random

import numpy as np

from kvsim.trace.table import Trace

SAMPLE_LENGTHS = ("equal", "uniform")


def sample_ends(trace: Trace, mode: str, seed: int) -> dict[int, list[int]]:
    """request -> the lengths (tokens) of its samples shorter than its `output_tokens`, longest first
    (the last entry ends first); requests whose samples all run to `output_tokens` are absent."""
    if mode not in SAMPLE_LENGTHS:
        raise ValueError(f"unknown sample-length mode {mode!r}; known: {', '.join(SAMPLE_LENGTHS)}")
    ends: dict[int, list[int]] = {}
    output = trace.output_tokens
    given = set()
    if trace.sample_offsets is not None:
        for i in np.flatnonzero(np.diff(trace.sample_offsets)).tolist():
            given.add(i)
            shorter = sorted((x for x in trace.sample_lengths(i) if x < output[i]), reverse=True)
            if shorter:
                ends[i] = shorter
    if mode == "uniform":
        for i in np.flatnonzero((trace.n > 1) & (trace.beam_width == 1)).tolist():
            if i in given:
                continue
            m = int(output[i])
            rng = random.Random(f"kvsim-samples:{seed}:{i}")
            shorter = sorted((x for x in (rng.randint(1, m) for _ in range(int(trace.n[i]) - 1)) if x < m),
                             reverse=True)
            if shorter:
                ends[i] = shorter
    return ends
