"""Where the rate search runs next: arithmetic on the runs it has made, no simulation.

Runs near the knee cost most (a rate that passes runs the whole trace; one just above the knee
misses its SLO only near the end), runs far above it least (they miss the SLO early and stop). So
the search spends its runs where a verdict ends it, using two things each run already tells:

- how late a failing run stopped, `stop_frac` (simulated time at the stop over the trace's span;
  1 for a run that went to the end): a run that missed the SLO late was close to the knee, one
  that missed it at once far above it. The next rate down is `rate x stop_frac ** 0.25`, kept
  between 1/1.5 (later 1/2) and 1/(1 + rel_tol) of it (`down_factor`). The rule is a rough measured
  relation, not a prediction (`docs/rate-search.md`: on ShareGPT lengths the knee sat within about
  15 % of it, on Alpaca lengths runs just above the knee can miss early); it only orders the runs,
  the verdicts decide.
- how close a passing run came to its limits, `worst` (the largest value / limit over the SLO's
  metrics): latency rises steeply just below the knee, so a pass at more than half its limit is
  within a few per cent of the knee, and the next run is one step of the tolerance above it.

Once both a passing and a failing rate are known (`lo` < `hi`), `narrow` picks the next rate
inside them: their geometric middle when one run ends the search either way (hi / lo <=
(1 + rel_tol) ** 2); one tolerance step from whichever side the runs say the knee is near; else
the step down from `hi`, kept inside the bracket. Each choice keeps the bracket: the search ends,
as before, when (hi - lo) / lo <= rel_tol, so its answer moves at most by that tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The step down from a failing rate: its stop fraction to this power, at most 1 / FIRST_DOWN of it at
#: first (then 1/2: `kvsim.planning.rate.max_rate`). Measured, not fitted to a published figure:
#: docs/rate-search.md (1.25 and 1.5 cost the same over its nine searches; 1.5 less on the issue's).
STOP_EXPONENT, FIRST_DOWN = 0.25, 1.5
#: A run that stopped after this fraction of the trace's span, or passed at more than `NEAR_WORST`
#: of its limits, is taken to be near the knee.
NEAR_STOP, NEAR_WORST = 0.8, 0.5


@dataclass(frozen=True)
class Tried:
    """One run of the search: `rate` (req/s), `ok` (met the SLO), `stop_frac` (failing runs: the
    fraction of the trace's span simulated when it stopped, 1 when it ran to the end) and `worst`
    (the largest metric value / limit, None when unknown)."""

    rate: float
    ok: bool
    stop_frac: float = 1.0
    worst: float | None = None


def down_factor(run: Tried, rel_tol: float, steepest: float = FIRST_DOWN) -> float:
    """The next rate below the failing `run`, as a fraction of its rate (module docstring), at least
    1 / `steepest` (the search lets this grow to 1/2 while rates keep failing).

    >>> round(down_factor(Tried(2.0, False, stop_frac=0.0081), 0.05), 4)   # 0.0081 ** 0.25 = 0.3 -> 1/1.5
    0.6667
    >>> round(down_factor(Tried(2.0, False, stop_frac=0.6561), 0.05), 4)   # 0.6561 ** 0.25 = 0.9
    0.9
    """
    gentle = 1 / (1 + rel_tol)
    return min(gentle, max(1 / steepest, max(run.stop_frac, 0.0) ** STOP_EXPONENT))


def done(lo: float, hi: float, rel_tol: float) -> bool:
    """Whether the bracket [lo, hi] is within the tolerance: (hi - lo) / lo <= rel_tol."""
    return (hi - lo) / lo <= rel_tol * (1 + 1e-9)       # (a rate set one step from the other: rounding)


def narrow(lo: Tried, hi: Tried, rel_tol: float) -> float:
    """The next rate inside the bracket of passing `lo` and failing `hi` (module docstring); strictly
    between them, and at least one tolerance step from each when the bracket is wider than two."""
    a, b = lo.rate, hi.rate
    step = 1 + rel_tol
    if b / a <= step * step:
        return math.sqrt(a * b)                       # either verdict ends the search
    if lo.worst is not None and lo.worst > NEAR_WORST:
        return a * step                               # just above a pass that came close
    if hi.stop_frac >= NEAR_STOP:
        return b / step                               # just below a failure that came late
    return math.sqrt(a * b)
