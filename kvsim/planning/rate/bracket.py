"""Where the rate search runs next: arithmetic on the runs it has made, no simulation.

Runs near the knee cost most (a rate that passes runs the whole trace; one just above the knee
misses its SLO only near the end), runs far above it least (they miss the SLO early and stop). So
the search spends its runs where a verdict ends it, using what each run already tells:

- a failing run that stopped early: how late, `stop_frac` (simulated time at the stop over the
  trace's span). A late miss was close to the knee, an early one far above it: the knee guess is
  `rate x stop_frac ** 0.25`. A rough measured relation, not a prediction (`docs/rate-search.md`:
  on ShareGPT lengths the knee sat within about 15 % of it; on Alpaca lengths a rate just above the
  knee can miss early); it only orders the runs, the verdicts decide.
- a failing run that went to the end (a metric the search does not watch, such as tpot): how far over
  its limit it came, `worst`; the guess is rate / worst, or, with two such runs, where the secant of
  log worst against log rate meets the limit (a metric that hardly grows with the rate steps far).
- a passing run: how close it came to its limits, `worst`: latency rises steeply just below the
  knee, so a pass at more than half its limit is within a few per cent of the knee.

`Descent` steps down from a failing start by the guess, kept between 1/1.5 (later 1/2) and
1/(1 + rel_tol) of the rate. Once a passing and a failing rate are known (`lo` < `hi`), `narrow`
picks the next rate inside them: their geometric middle when one run ends the search either way
(hi / lo <= (1 + rel_tol) ** 2); one tolerance step from whichever side the runs say the knee is
near; else the geometric middle. Each choice keeps the bracket: the search ends, as before, when
(hi - lo) / lo <= rel_tol, so its answer moves at most by that tolerance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: The step down from a failing rate: its stop fraction to this power, at most 1 / FIRST_DOWN of it at
#: first (then 1/2: `Descent`). Measured, not fitted to a published figure:
#: docs/rate-search.md (1.25 and 1.5 cost the same over its nine searches; 1.5 less on the issue's).
STOP_EXPONENT, FIRST_DOWN = 0.25, 1.5
#: A failing run that stopped after this fraction of the trace's span (or ran to the end within
#: 1 / 0.8 ** 0.25 = 1.057 x its limits), or a pass at more than `NEAR_WORST` of its limits, is taken
#: to be near the knee.
NEAR_STOP, NEAR_WORST = 0.8, 0.5


@dataclass(frozen=True)
class Tried:
    """One run of the search: `rate` (req/s), `ok` (met the SLO), `stop_frac` (failing runs: the
    fraction of the trace's span simulated when it stopped, 1 when it ran to the end) and `worst`
    (the largest metric value / limit of a run that went to the end, None when unknown)."""

    rate: float
    ok: bool
    stop_frac: float = 1.0
    worst: float | None = None


def knee_guess(run: Tried, above: Tried | None = None) -> float:
    """Where a failing `run` puts the knee, as a fraction of its rate. A run that went to the end
    `worst` x over its limit: with a failing run `above` it that also went to the end, the secant of
    log worst against log rate (worst = c rate ** k) meets 1 at worst ** (-1 / k) (0 when the
    latency did not grow); alone, 1 / worst (k = 1). Else stop_frac ** 0.25 (module docstring)."""
    if run.worst is not None and run.worst > 1:
        if above is not None and above.worst is not None and above.worst > 1 and above.rate > run.rate:
            k = math.log(above.worst / run.worst) / math.log(above.rate / run.rate)
            return run.worst ** (-1 / k) if k > 0 else 0.0
        return 1 / run.worst
    return max(run.stop_frac, 0.0) ** STOP_EXPONENT


class Descent:
    """The steps down from a failing start, one `factor(run)` per failing run (the next rate is
    `run.rate x factor`): `knee_guess` (with the failing run before as `above`), kept between 1 / 1.5
    at first (1/2 after) and 1 / (1 + rel_tol). Steps held at 1 / (1 + rel_tol) two times running
    then double (in log rate) each time, down to 1/2: a guess that keeps saying "near" is wrong (a short
    trace whose runs all stop near its end).

    >>> d = Descent(0.05)
    >>> round(d.factor(Tried(2.0, False, stop_frac=0.0081)), 4)   # 0.0081 ** 0.25 = 0.3 -> 1/1.5
    0.6667
    >>> round(d.factor(Tried(1.3, False, stop_frac=0.6561)), 4)   # 0.6561 ** 0.25 = 0.9
    0.9
    """

    def __init__(self, rel_tol: float):
        self.rel_tol, self.steepest, self.above, self.creeping = rel_tol, FIRST_DOWN, None, 0

    def factor(self, run: Tried) -> float:
        gentlest = (1 + self.rel_tol) ** -(2 ** max(0, self.creeping - 1))
        guess = knee_guess(run, self.above)
        f = max(0.5, min(gentlest, max(1 / self.steepest, guess)))
        self.creeping = self.creeping + 1 if guess >= gentlest else 0
        self.steepest, self.above = min(2.0, self.steepest * 1.5), run
        return f


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
    if knee_guess(hi) >= NEAR_STOP ** STOP_EXPONENT:
        return b / step                               # just below a failure that came late or close
    return math.sqrt(a * b)
