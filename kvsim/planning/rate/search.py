"""The highest request rate that meets a latency SLO, and the GPUs that serve a rate.

`max_rate` starts near the rate at which the engine saturates (`kvsim.planning.rate.bounds`), never
above the serving ceiling (the rate past which arrivals outrun any schedule); from a passing start it
steps up by 1.25x, then 1.9x, then doubling; from a failing one it steps down by how late that run
missed the SLO (`kvsim.planning.rate.bracket`), then narrows the bracket (one run per round, whatever
`workers`: beside whichever run came close, else the geometric middle) until it is within `rel_tol`.
A run stops as soon as it has missed the SLO for certain (its verdict cannot change), so rates above the knee cost
a fraction of a run. A preset's rates all
replay one draw of requests with its Poisson arrival times rescaled (common random numbers), cut at the
duration; a real trace is rescaled likewise. A rate is judged at steady state (`kvsim.planning.rate.steady`,
`kvsim.planning.rate.windows`): a run whose requests in the system still grow, or whose SLO batch means
cannot tell pass from fail, runs again on a trace twice as long (up to `max_span_s`), so the answer
does not move with `--duration`. Should the curve still be non-monotone near the knee, the
answer is the highest passing rate below the lowest failing one. Each rate is one run on
a Poisson trace of a preset at that rate, or on a real trace with its arrivals rescaled to it. The
tried rates form the latency-against-rate curve; the first failing rate is the knee, and the summary's
`limited_by` (time fractions while requests waited) says what held requests back there.

>>> parse_slo(["ttft_p99=2", "tpot_p50=0.05"])
{'ttft_p99': 2.0, 'tpot_p50': 0.05}
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from operator import mul
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from kvsim.engine.config import SimConfig
from kvsim.planning.rate.runs import BASE_BLOCK, base_trace as _base_trace  # noqa: F401 (re-exported)
from kvsim.planning.runs import make_config
from kvsim.trace.table import Trace

if TYPE_CHECKING:
    import pandas as pd

#: SLO metric names: `<ttft|tpot|e2e>_<p50|p90|p99|mean>` (seconds) and `normalized_latency` (s/token).
SLO_METRICS = tuple(f"{m}_{q}" for m in ("ttft", "tpot", "e2e") for q in ("p50", "p90", "p99", "mean")) + (
    "normalized_latency",)
#: Rates tried per narrowing round: fixed, so that the answer does not depend on the machine's core count
#: (`workers` chose this number before: the same command answered 51.4 req/s on two cores and 50.6 on one,
#: and the API, whose default is one worker, differed from the command line). One run lets the round use
#: how close the bracket's runs came (`kvsim.planning.rate.bracket.narrow`).
SECTIONS = 1
LIMITS = ("kv_memory", "max_num_seqs", "token_budget", "compute", "latency")
#: Rates the bracket search stays within, req/s.
MIN_RATE_RPS, MAX_RATE_RPS = 1 / 64, 4096.0


def parse_slo(items: Sequence[str] | Mapping[str, float]) -> dict[str, float]:
    """`["ttft_p99=2", ...]` or a dict -> {metric: limit}; limits in seconds (s/token for
    `normalized_latency`), > 0. ValueError naming the bad item."""
    pairs = items.items() if isinstance(items, Mapping) else []
    if not isinstance(items, Mapping):
        for item in items:
            name, sep, value = str(item).partition("=")
            if not sep:
                raise ValueError(f"--slo {item!r}: expected metric=seconds, e.g. ttft_p99=2")
            pairs.append((name, value))
    slo: dict[str, float] = {}
    for name, value in pairs:
        name = name.strip()
        if name not in SLO_METRICS:
            raise ValueError(f"--slo {name!r}: unknown metric; known: {', '.join(SLO_METRICS)}")
        try:
            limit = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"--slo {name}={value!r}: the limit must be a number of seconds") from None
        if not limit > 0:
            raise ValueError(f"--slo {name}={value}: the limit must be > 0 s")
        slo[name] = limit
    if not slo:
        raise ValueError("give at least one --slo metric=seconds, e.g. --slo ttft_p99=2")
    return slo


def slo_value(row: Mapping[str, Any], metric: str) -> float | None:
    """The value of SLO `metric` in a flat run row (`summary_row`), None when no request finished."""
    key = "normalized_latency_s_per_token" if metric == "normalized_latency" else metric.replace("_", "_s_", 1)
    value = row.get(key)
    return None if value is None or value != value else float(value)


def meets(row: Mapping[str, Any], slo: Mapping[str, float]) -> bool:
    """Whether a run row finished without error and every SLO metric is within its limit (a run the
    search stopped early, `stopped_early_s`, had missed it for certain; one whose queue still grew at the
    longest trace tried, `still_growing`, is not stable: `kvsim.planning.rate.steady`)."""
    if row.get("status") != "ok" or row.get("stopped_early_s") is not None or row.get("still_growing"):
        return False
    return all((v := slo_value(row, m)) is not None and v <= limit for m, limit in slo.items())


def limiting_factor(row: Mapping[str, Any]) -> str:
    """What limited a run (`kvsim.planning.limits.limit_of`: the admission limit that bound the batch, or
    `compute` when the GPU was busy, `latency` when it was not): the key; `limit_of(row).text` says it
    with the run's figures."""
    from kvsim.planning.limits import limit_of
    return limit_of(row).key


@dataclass
class RateResult:
    """`rate_rps`: the highest rate tried that meets `slo`; `rows`: one run row per rate tried (sorted,
    with `meets_slo`), `curve` the same as a DataFrame; `limited_by`: what limited the first failing
    rate, the knee (`knee`: its row)."""

    rate_rps: float
    slo: dict[str, float]
    rows: list[dict]
    limited_by: str
    knee: dict = field(default_factory=dict)
    ceiling_rps: float = math.inf          # the serving ceiling the search stayed under (req/s)
    span_s: float | None = None            # the trace span (s) the answer was judged steady on
    note: str = ""                         # why the answer is a bound ('' when it is not)

    @property
    def limit_key(self) -> str:
        """`limited_by`'s key (`kvsim.planning.limits.KEYS`), or `none` when no rate tried failed."""
        return limiting_factor(self.knee) if self.knee else "none"

    @property
    def hi_rps(self) -> float | None:
        """The lowest failing rate (req/s): the knee lies in [rate_rps, hi_rps); None when none failed."""
        return self.knee.get("rate")

    @cached_property
    def curve(self) -> pd.DataFrame:
        """`rows` as a DataFrame, made on first use (pandas is imported here, not by the search)."""
        import pandas as pd

        return pd.DataFrame(self.rows)


def _evaluate(rates: list[float], spans: list[float | None], cfg: SimConfig, workload: dict,
              trace: Trace | None, workers: int, slo: Mapping[str, float]) -> list[dict]:
    """One run per rate (`kvsim.planning.rate.runs`: stopped once it has missed `slo`): `trace`
    rescaled to the rate (a real trace: `rate`; the common base trace of a preset: `time_scale`
    1/rate, cut at its span in `spans`, s); rows in the order of `rates`."""
    from kvsim.planning.rate.runs import evaluate

    key = "rate" if "duration_s" not in workload else "time_scale"
    points = [{**workload, key: r if key == "rate" else 1.0 / r, **({"duration_s": d} if key != "rate" else {})}
              for r, d in zip(rates, spans)]
    from kvsim.planning.sweep.grid import run_id

    rows: dict[str, dict] = {}
    evaluate(points, trace, cfg, slo, workers, lambda row: rows.__setitem__(row["run_id"], row))
    return [{**rows[run_id(p)], "rate": r} for p, r in zip(points, rates)]


def max_rate(slo: Sequence[str] | Mapping[str, float], config: SimConfig | None = None, *,
             trace: Trace | str | None = None, preset: str | None = "sharegpt", duration_s: float = 600.0,
             seed: int = 0, lo_rps: float | None = None, hi_rps: float | None = None, rel_tol: float = 0.05,
             max_runs: int = 16, workers: int = 1, progress: Callable[[str], None] | None = None,
             max_span_s: float = 3600.0, **flags: Any) -> RateResult:
    """The highest request rate (req/s) whose run meets `slo` (see `parse_slo`), within `rel_tol`.

    Workload: a Poisson trace of `preset` lasting `duration_s` s (seed `seed`), or `trace` (a Trace or
    a file) with its arrivals rescaled to each rate. The search starts from a guess made from the cache
    size and the trace's mean lengths (`lo_rps` instead when given) and never goes above the serving
    ceiling (`kvsim.planning.rate.bounds`; `hi_rps` lowers the cap): when the ceiling meets the SLO the
    answer is the ceiling, and `limited_by` says the SLO holds at every rate up to it. Runs that have
    missed the SLO for certain stop early. Each verdict is a steady-state one (`kvsim.planning.rate.steady`:
    a trend test on the requests in the system, batch means of the SLO with a confidence interval): a
    run that cannot tell yet runs again on a preset trace twice as long, up to `max_span_s` s. The
    answer comes with `hi_rps` (the knee lies in [rate_rps, hi_rps)), `span_s` (the trace it was judged
    on) and `note` (why it is a bound, when it is one). At most `max_runs` rates; `progress(message)`
    hears of each run. ValueError when no rate tried meets the SLO.

    >>> import kvsim
    >>> r = kvsim.max_rate({"normalized_latency": 0.1}, preset="alpaca", duration_s=60,
    ...                    model="opt-13b", kv_gib=12, rel_tol=0.25)  # doctest: +SKIP
    """
    from kvsim.planning.rate.bounds import serve_ceiling_rps, start_rate_rps
    from kvsim.planning.rate.bracket import Descent, done, narrow

    slo = parse_slo(slo)
    if not 0 < rel_tol < math.inf:
        raise ValueError(f"--rel-tol must be a positive number, got {rel_tol}")
    cfg = make_config(config, **flags)
    if isinstance(trace, str) or (trace is not None and not isinstance(trace, Trace)):
        from kvsim.trace.formats import load_trace
        trace = load_trace(trace)
    workload = {"seed": cfg.seed} if trace is not None else {"duration_s": duration_s, "seed": seed}
    sample = trace if trace is not None else _base_trace(preset or "sharegpt", 1.0, seed)
    ceiling = min(serve_ceiling_rps(cfg, sample), MAX_RATE_RPS)
    cap = min(ceiling, hi_rps) if hi_rps else ceiling
    tried: dict[float, dict] = {}
    base: list[Trace] = []

    def at(rates: list[float], spans: list[float | None]) -> list[dict]:
        nonlocal trace
        if "duration_s" in workload and (not base or base[0].arrival_s[-1] < max(map(mul, spans, rates))):
            base[:] = [_base_trace(preset or "sharegpt", max(map(mul, spans, rates)), seed)]
            trace = base[0]
        return _evaluate(rates, spans, cfg, workload, trace, workers, slo)

    def run(rates: list[float]) -> None:
        from kvsim.planning.rate.steady import settle

        new = [r for r in rates if r not in tried][: max(0, max_runs - len(tried))]
        span = duration_s if "duration_s" in workload else None
        for r, row in zip(new, settle(new, span, rel_tol / 2, at, lambda row: meets(row, slo), progress,
                                        max_span_s)):
            row["meets_slo"] = meets(row, slo)
            tried[r] = row
            if progress is not None:
                stop, grew = row.get("stopped_early_s"), row.get("still_growing")
                verdict = ("meets the SLO" if row["meets_slo"] else "misses the SLO" +
                           (f" (stopped at {stop:.0f} s of simulated time)" if stop is not None else "") +
                           (f" (requests in the system still growing at {grew:.0f} s)" if grew else ""))
                on = f" on a {row['span_s']:.0f} s trace" if row.get("span_s") else ""
                progress(f"rate search: run {len(tried)} of at most {max_runs}: {r:.4g} req/s {verdict}{on}, "
                         f"{row.get('wall_s', 0.0):.1f} s")

    def ok(r: float) -> bool:
        return tried[r]["meets_slo"]

    lo = hi = None
    start = min(lo_rps or start_rate_rps(cfg, sample), cap)
    if progress is not None:
        progress(f"rate search: serving ceiling {ceiling:.4g} req/s; starting at {start:.4g} req/s")
    run([start])
    factor = 1.25                    # a pass at the guess: small steps up first, doubling after
    if ok(start):
        lo, r = start, start
        while hi is None and len(tried) < max_runs and r < cap:
            r = min(r * factor, cap)
            factor = min(2.0, factor * 1.5)
            run([r])
            if r not in tried:
                break
            lo, hi = (r, None) if ok(r) else (lo, r)
    else:
        hi, r, descent = start, start, Descent(rel_tol)
        while lo is None and r > MIN_RATE_RPS and len(tried) < max_runs:
            r = max(r * descent.factor(_tried(tried[r], slo)), MIN_RATE_RPS)
            run([r])
            if r not in tried:
                break
            lo, hi = (r, hi) if ok(r) else (None, r)
    if lo is None:
        first = tried[min(tried)]
        got = ", ".join(f"{m} = {_fmt(slo_value(first, m))}" for m in slo)
        raise ValueError(f"no rate meets the SLO {slo_text(slo)}: the lowest rate tried, {min(tried):.3g} req/s, "
                         f"gives {got}" + (f" ({first['error']})" if first.get("error") else ""))
    while hi is not None and not done(lo, hi, rel_tol) and len(tried) < max_runs:
        k = max(1, min(SECTIONS, max_runs - len(tried)))
        run([narrow(_tried(tried[lo], slo), _tried(tried[hi], slo), rel_tol)] if k == 1 else
            [lo + (hi - lo) * j / (k + 1) for j in range(1, k + 1)])
        hi = min(r for r in tried if not ok(r))          # conservative when noise makes the curve
        lo = max(r for r in tried if r < hi and ok(r))   # non-monotone: below the lowest failure
    rows = [tried[r] for r in sorted(tried)]
    knee = {} if hi is None else tried[hi]
    if knee:
        from kvsim.planning.limits import limit_of
        limited = limit_of(knee).text
    elif lo >= ceiling:
        limited = (f"none: meets the SLO at every rate up to {ceiling:.4g} req/s, the serving ceiling "
                   "(above it arrivals outrun the engine and queues grow without bound)")
    else:
        limited = "none (highest rate tried met the SLO)"
    from kvsim.planning.rate.steady import bound_note
    note = bound_note(tried[lo], knee or None, rel_tol)
    return RateResult(lo, slo, rows, limited, knee, ceiling, tried[lo].get("span_s"), note)


_QUANTILE = {"p50": 0.5, "p90": 0.9, "p99": 0.99}


def _tried(row: Mapping[str, Any], slo: Mapping[str, float]):
    """A run row as `kvsim.planning.rate.bracket.Tried`: a stopped run's simulated time over the span of
    its trace at its rate (requests / rate), and the largest value / limit of a run that went to the end."""
    from kvsim.planning.rate.bracket import Tried

    stop, rate = row.get("stopped_early_s"), row["rate"]
    stopped = stop is not None and stop == stop
    frac = 1.0
    if stopped and row.get("requests_total"):
        frac = min(1.0, max(0.0, stop * rate / row["requests_total"]))
        floor = min(1 - _QUANTILE.get(m.rsplit("_", 1)[-1], 1.0) for m in slo)
        frac = (frac - floor) / (1 - floor) if frac > floor else 0.0   # p50 misses stop past half the span
    values = [None] if stopped or row.get("status") != "ok" else [slo_value(row, m) for m in slo]
    worst = None if None in values else max(v / slo[m] for v, m in zip(values, slo))
    return Tried(rate, bool(row.get("meets_slo")), frac, worst)


def _fmt(v: float | None) -> str:
    return "no finished request" if v is None else f"{v:.3g}"


def slo_text(slo: Mapping[str, float]) -> str:
    """An SLO as text: `ttft_p99 <= 2, tpot_p50 <= 0.05`."""
    return ", ".join(f"{k} <= {v:g}" for k, v in slo.items())
