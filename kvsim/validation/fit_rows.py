"""The linear model `kvsim calibrate` fits, and its rows from a simulated run.

A step of the simulated engine lasts (kvsim.cost.adjusted, kvsim.engine.step):

    duration = gpu_time_scale x K + 2 x layers x allreduce_delta_s [TP > 1] + cpu_step_s + cpu_seq_s x n

with K the evidence-based kernel time and n the running sequences. A request's decode time per token
is the mean duration of the steps it decodes in, so a stage's measured TPOT (physical: generated tokens)
is, to first order, the same expression over the stage's steps weighted by their decoding sequences:

    tpot = gpu_time_scale x K_bar + allreduce_delta_s x T + cpu_step_s + cpu_seq_s x n_bar

One row per measured stage (the whole run where there are no stages): the regressors (K_bar, T, 1,
n_bar) and the target, all in seconds. K is recovered from each simulated step by undoing the profile
the run used. Because the batch a run builds depends on its step times, `kvsim.validation.fit` refits
once on rows from a run under the first fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

#: Fitted parameters in the order of the regressors, with their bounds (seconds, or a factor).
PARAMS = ("gpu_time_scale", "allreduce_delta_s", "cpu_step_s", "cpu_seq_s")
BOUNDS = {"gpu_time_scale": (0.2, 5.0), "allreduce_delta_s": (-3e-5, 1e-4), "cpu_step_s": (0.0, 2e-2),
          "cpu_seq_s": (0.0, 1e-3)}


@dataclass(frozen=True)
class Row:
    """One measured stage: regressors (K_bar, T, 1, n_bar) and target TPOT, seconds."""

    run: str
    stage: int
    x: tuple[float, float, float, float]
    y: float
    gpu: str = ""


def params_of(profile) -> dict[str, float]:
    """The fitted parameters' current values in `profile` (a CalibratedProfile or a plain one)."""
    return {"gpu_time_scale": getattr(profile, "gpu_time_scale", 1.0),
            "allreduce_delta_s": getattr(profile, "allreduce_delta_s", 0.0),
            "cpu_step_s": profile.cpu_step_s, "cpu_seq_s": profile.cpu_seq_s}


def stages_of(run) -> list[int]:
    """The measured stages a run's rows use: its stages, or the whole run (-1) where it has none."""
    return sorted(k for k in run.measured if k >= 0) or [-1]


def rows_of(run, result, trace, stage_of, profile, tp: int, layers: int, gpu: str = "") -> list[Row]:
    """Rows (module docstring) of `run` on `gpu` simulated as `result` under `profile` (its values for
    that GPU)."""
    p = params_of(profile)
    steps = result.step_columns
    t, dur = np.asarray(steps["time_s"]), np.asarray(steps["duration_s"])
    n, dec = np.asarray(steps["running"], dtype=float), np.asarray(steps["decode_tokens"], dtype=float)
    T = 2 * layers if tp > 1 else 0.0
    kernel = (dur - p["cpu_step_s"] - p["cpu_seq_s"] * n - p["allreduce_delta_s"] * T) / p["gpu_time_scale"]
    out = []
    for k in stages_of(run):
        y = run.measured[k].get("tpot_ms")
        if not y:
            continue
        arrivals = trace.arrival_s if k < 0 else trace.arrival_s[stage_of == k]
        if len(arrivals) == 0:
            continue
        window = (t >= arrivals[0]) & (t <= arrivals[-1]) & (dec > 0)
        if not window.any():
            continue
        w = dec[window]
        out.append(Row(run.name, k, (float(np.average(kernel[window], weights=w)), float(T), 1.0,
                                     float(np.average(n[window], weights=w))), y / 1e3, gpu))
    return out


def ttft_rows(run, result, trace, stage_of) -> list[tuple]:
    """TTFT rows for the client path's fit (`kvsim.validation.client_path.fit_client`), one per measured
    stage: (measured TTFT, the engine's mean TTFT of the stage's finished requests, mean prompt tokens);
    seconds and tokens."""
    first = np.asarray(result.request_columns["first_token_s"], dtype=float)
    arrival = np.asarray(trace.arrival_s, dtype=float)
    out = []
    for k in stages_of(run):
        m = np.isfinite(first) & ((stage_of == k) if k >= 0 else True)
        meas = run.measured[k].get("ttft_ms")
        if meas and m.any():
            out.append((meas / 1e3, float(np.mean(first[m] - arrival[m])), float(np.mean(trace.prompt_tokens[m]))))
    return out


def solve(rows: list[Row], free: list[str], fixed: dict[str, float]) -> dict[str, float]:
    """Bounded least squares of relative error, (model - y) / y, over `free` parameters (the others at
    `fixed`): the unconstrained solution, then parameters past a bound pinned there and the rest
    re-solved, until none is out (at most once per parameter)."""
    X = np.array([r.x for r in rows], dtype=float)
    y = np.array([r.y for r in rows], dtype=float)
    X, y1 = X / y[:, None], np.ones_like(y)          # relative: divide each row by its target
    value = dict(fixed)
    pinned: dict[str, float] = {}
    for _ in range(len(free) + 1):
        active = [p for p in free if p not in pinned]
        rest = y1 - sum(X[:, PARAMS.index(q)] * v for q, v in {**fixed, **pinned}.items() if q not in active)
        if active:
            cols = X[:, [PARAMS.index(q) for q in active]]
            sol, *_ = np.linalg.lstsq(cols, rest, rcond=None)
        else:
            sol = []
        out = dict(zip(active, map(float, sol)))
        bad = {q: min(max(v, BOUNDS[q][0]), BOUNDS[q][1]) for q, v in out.items()
               if not BOUNDS[q][0] <= v <= BOUNDS[q][1]}
        if not bad:
            value.update(out)
            value.update(pinned)
            return value
        worst = max(bad, key=lambda q: abs(out[q] - bad[q]))
        pinned[worst] = bad[worst]
    value.update(pinned)
    return value


def identifiable(rows: list[Row]) -> tuple[list[str], dict[str, str]]:
    """(parameters the rows can fit, {parameter: why not}). A parameter needs its regressor to vary
    across rows (the constant term aside), and every fitted parameter needs two rows."""
    X = np.array([r.x for r in rows], dtype=float) if rows else np.zeros((0, 4))
    free, why = [], {}
    for q in ("gpu_time_scale", "cpu_step_s", "allreduce_delta_s", "cpu_seq_s"):     # priority order
        col = X[:, PARAMS.index(q)] if len(X) else np.zeros(0)
        if q == "allreduce_delta_s" and (len(set(col)) < 2 or not col.any()):
            why[q] = ("not identifiable: the runs do not mix TP 1 and TP > 1" if col.any()
                      else "not identifiable: every run is at TP 1")
        elif q == "cpu_seq_s" and np.ptp(col) < 0.1 * max(col.mean(), 1e-9):
            why[q] = "not identifiable: the running batch barely varies across the runs"
        elif len(rows) < 2 * (len(free) + 1):
            why[q] = f"too few measured stages ({len(rows)}): each fitted parameter needs two"
        else:
            free.append(q)
    return free, why


#: Properties of a GPU and its interconnect (kernel efficiency, collective latency): fitted per GPU and
#: never carried to another GPU. The CPU terms (the engine's host work) are fitted per GPU where its
#: rows allow and otherwise taken from the fit over every GPU's rows.
GPU_SIDE = ("gpu_time_scale", "allreduce_delta_s")


def _gpu_fit(mine: list[Row], start: dict) -> tuple[dict, list[str], dict]:
    """(values, fitted parameters, {parameter: why not}) of one GPU's rows, unfitted ones at `start`.
    TP > 1 rows fit the GPU's efficiency only where its all-reduce latency is identified too (TP 1 and
    TP > 1 rows); otherwise only its TP 1 rows do (the all-reduce's error would be read as the kernels')."""
    free, kept = identifiable(mine)
    if "allreduce_delta_s" not in free and any(r.x[1] > 0 for r in mine):
        reason = kept["allreduce_delta_s"]
        single = [r for r in mine if r.x[1] == 0]
        free, kept = identifiable(single) if single else ([], {})
        kept["allreduce_delta_s"] = reason
        if not single:
            kept.update({q: "not identifiable apart from the all-reduce: every run of this GPU is at TP > 1"
                         for q in PARAMS if q != "allreduce_delta_s"})
        mine = single
    return (solve(mine, free, start) if mine else dict(start)), free, kept


def fit_by_gpu(rows: list[Row], base: dict[str, float]) -> tuple[dict, dict]:
    """({gpu: values}, {gpu: {parameter: why not fitted}}); under the key "" of both, the values a GPU
    without rows takes. GPU-side parameters are fitted per GPU (`_gpu_fit`) or kept at `base`; the CPU
    terms per GPU where its rows allow, otherwise from the fit over the rows of every GPU whose
    efficiency its own rows identified (their GPU-side part taken out), or `base` where there is none."""
    groups = {g: [r for r in rows if r.gpu == g] for g in sorted({r.gpu for r in rows})}
    first = {g: _gpu_fit(mine, base) for g, mine in groups.items()}
    known = [Row(r.run, r.stage, (first[g][0]["gpu_time_scale"] * r.x[0] + first[g][0]["allreduce_delta_s"] * r.x[1],
                                  0.0, 1.0, r.x[3]), r.y, g)
             for g, mine in groups.items() if "gpu_time_scale" in first[g][1] for r in mine]
    cpu_free, cpu_why = identifiable(known) if known else ([], {})
    cpu_free = [q for q in cpu_free if q not in GPU_SIDE]
    shared = solve(known, cpu_free, {**base, "gpu_time_scale": 1.0, "allreduce_delta_s": 0.0}) if known else base
    pooled = {q: (base[q] if q in GPU_SIDE else shared[q]) for q in PARAMS}
    src = (f"from the fit over {len(known)} rows of GPUs with a fitted efficiency" if known
           else "the base profile's value: no GPU's efficiency is fitted")
    values = {"": pooled}
    why = {"": {q: ("kept at the base profile's value: no runs of this GPU" if q in GPU_SIDE else
                    src + (f" ({cpu_why[q]})" if q in cpu_why and known else "")) for q in PARAMS}}
    for g, mine in groups.items():
        vals, free, kept = _gpu_fit(mine, pooled)
        values[g] = vals
        why[g] = {q: (kept.get(q, "") + ("; kept at the base profile's value" if q in GPU_SIDE else "; " + src))
                  for q in PARAMS if q not in free}
    return values, why
