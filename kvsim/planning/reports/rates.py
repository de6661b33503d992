"""The report's latency-against-rate grid, placed from the run itself: a few rates around the trace's
own and a few around where the engine saturates, so the curve spans below and past its knee (issue 41:
a grid of the trace's rate x 0.25-3 stopped at a third of the knee for Llama-3-8B at 4 req/s on an H100,
four flat lines).

The saturation rate is the rate search's first guess (`kvsim.planning.rate.bounds.start_rate_rps`:
Little's law over the time-weighted KV footprints, steps timed at that batch), never above the
serving ceiling; the grid takes it x SATURATION_MULTIPLES and the trace's rate x TRACE_MULTIPLES,
rates within 10 % of one already taken dropped.
"""

from __future__ import annotations

from kvsim.engine.config import SimConfig
from kvsim.trace.table import Trace

TRACE_MULTIPLES = (0.5, 1.0)
#: Below, at and past the saturation guess (the knee of a latency SLO lies below it, the curve's
#: climb past it).
SATURATION_MULTIPLES = (0.25, 0.5, 0.75, 0.9, 1.0, 1.15, 1.3)


def rate_grid(trace: Trace, cfg: SimConfig, base_rate: float) -> list[float]:
    """Rates (req/s, rounded to 4 digits, ascending) for the report's latency curve (module docstring)."""
    from kvsim.planning.rate.bounds import serve_ceiling_rps, start_rate_rps

    try:
        sat = min(start_rate_rps(cfg, trace), serve_ceiling_rps(cfg, trace))
    except ValueError:                       # (no request of the trace fits the model)
        sat = base_rate
    wanted = sorted({base_rate * m for m in TRACE_MULTIPLES} | {sat * m for m in SATURATION_MULTIPLES})
    out: list[float] = []
    for r in wanted:
        if r > 0 and (not out or r > out[-1] * 1.1):
            out.append(round(r, 4))
    return out
