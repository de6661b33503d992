"""`kvsim calibrate`: fit named profile parameters to measured runs, with leave-one-out error.

Parameters (`kvsim.validation.fit_rows`): `gpu_time_scale` (GEMM and attention efficiency together:
the runs' end-to-end figures cannot tell them apart), `allreduce_delta_s` (collective latency),
`cpu_step_s` and `cpu_seq_s` (CPU time per step and per running sequence), fitted to each measured
stage's physical TPOT; then `client_fixed_s` (the client path's fixed part,
`kvsim.validation.client_path`), the median over HTTP-client runs the server sustained of measured TTFT
minus the predicted engine TTFT and per-token part. Runs the server did not sustain (measured
`overloaded`) are left out of the fit, as the sim-to-real study left them out of its training;
leave-one-out still predicts them. A parameter the runs cannot fit is kept at the base profile's value
and the reason is reported.

Leave-one-out: for each replayable run, fit on the others' rows (from the final iteration) and predict it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from statistics import median

from kvsim.validation.client_path import HTTP_CLIENTS, ClientPath
from kvsim.validation.compare import medians, rows as table_rows
from kvsim.validation.fit_rows import PARAMS, identifiable, params_of, rows_of, solve


@dataclass
class CalibrationResult:
    """The fitted values, what could not be fitted and why, the per-run replays with their
    leave-one-out predictions, and the wall time."""

    base: str
    values: dict
    client: ClientPath
    kept: dict
    fitted_runs: list
    replays: list = field(default_factory=list)
    wall_s: float = 0.0
    scale: float = 1.0

    def loo_medians(self) -> dict:
        return medians(table_rows(self.replays, key="loo"))

    def default_medians(self) -> dict:
        return medians(table_rows(self.replays, key="predicted"))

    def to_dict(self) -> dict:
        from kvsim.validation.run_set import _clean
        return _clean({"base": self.base, "fitted": self.values, "client_path": self.client.to_dict(),
                       "kept_at_base": self.kept, "fitted_on": self.fitted_runs, "scale": self.scale,
                       "median_ape_pct_default": self.default_medians(),
                       "median_ape_pct_leave_one_out": self.loo_medians(),
                       "runs": [r.to_dict() for r in self.replays], "wall_s": self.wall_s})

    def text(self) -> str:
        lines = [f"fitted on {len(self.fitted_runs)} runs (traces at {self.scale:g} of each stage):"]
        lines += [f"  {k} = {v:.6g}" + (f"  (kept: {self.kept[k]})" if k in self.kept else "")
                  for k, v in self.values.items()]
        lines.append(f"  client_fixed_s = {self.client.fixed_s:.6g}"
                     + (f"  (kept: {self.kept['client_fixed_s']})" if "client_fixed_s" in self.kept else ""))
        fmt = (lambda d: ", ".join(f"{k} {v:.1f}%" if v is not None else f"{k} -" for k, v in d.items()))
        lines.append(f"median APE, base profile: {fmt(self.default_medians())}")
        if any(r.loo for r in self.replays):
            lines.append(f"median APE, leave-one-out: {fmt(self.loo_medians())}")
        return "\n".join(lines)


def with_values(base, values: dict, name: str = "calibrated"):
    """`base` as a CalibratedProfile holding `values`."""
    from kvsim.cost.profiles import CalibratedProfile
    fields = {k: v for k, v in base.to_dict().items() if k not in ("gpu_time_scale", "allreduce_delta_s")}
    fields.update(name=name, variant="measured", cpu_step_s=values["cpu_step_s"], cpu_seq_s=values["cpu_seq_s"])
    return CalibratedProfile(**fields, gpu_time_scale=values["gpu_time_scale"],
                             allreduce_delta_s=values["allreduce_delta_s"])


def _simulate(run, profile, client, gpu, seed, scale):
    """(replay with predictions, rows) of one run; a run kvsim cannot replay gives (replay, [])."""
    from kvsim.validation.replay import replay
    rep = replay(run, profile, client, gpu, seed, scale, keep=True)
    if rep.skip:
        return rep, []
    cfg, trace, stage_of, result = rep.parts
    rep.parts = ()
    if getattr(cfg.deployment, "dp", 1) > 1:     # several engines: no single step log to fit to
        return rep, []
    return rep, rows_of(run, result, trace, stage_of, profile, cfg.deployment.tp, cfg.deployment.model.num_layers)


def _fit(rows, base_values) -> tuple[dict, dict]:
    free, why = identifiable(rows)
    return solve(rows, free, base_values), why


def _client_fixed(replays, runs, client: ClientPath) -> tuple[float, str | None]:
    """The client path's fixed part from sustained HTTP-client runs (module docstring)."""
    gaps = []
    for rep, run in zip(replays, runs):
        if rep.skip or run.overloaded or run.client not in HTTP_CLIENTS:
            continue
        meas, pred = run.measured[-1].get("ttft_ms"), rep.predicted.get(-1, {}).get("ttft_ms")
        if meas is not None and pred is not None:
            gaps.append((meas - pred) / 1e3 + client.fixed_s)
    if len(gaps) < 2:
        return client.fixed_s, f"too few sustained HTTP-client runs ({len(gaps)}): kept at the evidence value"
    return max(median(gaps), 0.0), None


def calibrate(runs, base, gpu=None, seed: int = 0, scale: float = 0.25, loo: bool = True,
              progress=None, defaults=None) -> CalibrationResult:
    """Fit (module docstring); `base` an EngineProfile; `defaults`: the runs' replays under `base` at
    this `scale` when already made (else they are simulated here)."""
    say = progress or (lambda text: None)
    client = ClientPath()
    base_values = params_of(base)
    fit_runs = [r for r in runs if not r.overloaded]
    profile, values, why = base, dict(base_values), {}
    rows_by_run: dict = {}
    for it in range(2):                     # fit, then refit on rows from runs under the first fit
        rows_by_run = {}
        for run in fit_runs:
            rep, rows = _simulate(run, profile, client, gpu, seed, scale)
            if rows:
                rows_by_run[run.name] = rows
        rows = [row for group in rows_by_run.values() for row in group]
        if not rows:
            raise ValueError("no replayable, sustained run with a measured TPOT to fit to")
        values, why = _fit(rows, base_values)
        profile = with_values(base, values)
        say(f"iteration {it + 1}: " + ", ".join(f"{k}={v:.4g}" for k, v in values.items()))
    result_replays = defaults or [_simulate(run, base, ClientPath(), gpu, seed, scale)[0] for run in runs]
    calibrated_reps = [_simulate(run, profile, client, gpu, seed, scale)[0] for run in runs]
    fixed, reason = _client_fixed(calibrated_reps, runs, client)
    kept = dict(why)
    if reason:
        kept["client_fixed_s"] = reason
    client = replace(client, fixed_s=fixed, source=f"kvsim calibrate: median TTFT gap over sustained runs")
    result = CalibrationResult(base.name, values, client, kept, sorted(rows_by_run), result_replays, scale=scale)
    if loo:
        for i, run in enumerate(runs):
            rep = result_replays[i]
            if rep.skip:
                continue
            others = [row for name, group in rows_by_run.items() if name != run.name for row in group]
            v, _ = _fit(others, base_values)
            prof = with_values(base, v, f"loo-{run.name}")
            others_runs = [r for r in runs if r.name != run.name]
            others_reps = [c for c, r in zip(calibrated_reps, runs) if r.name != run.name]
            fx, _ = _client_fixed(others_reps, others_runs, ClientPath())
            loo_rep, _ = _simulate(run, prof, replace(client, fixed_s=fx), gpu, seed, scale)
            rep.loo = loo_rep.predicted
            say(f"leave-one-out {i + 1}/{len(runs)}: {run.name}")
    return result


def profile_document(result: CalibrationResult, name: str, sources: list[str]) -> dict:
    """The engine-profile file (`--engine-profile FILE` reads base, cpu_step_s, cpu_seq_s,
    gpu_time_scale, allreduce_delta_s; `kvsim validate` also its client_path)."""
    doc = {"name": name, "base": result.base, **{k: result.values[k] for k in PARAMS},
           "client_path": result.client.to_dict(),
           "source": f"kvsim calibrate on {len(result.fitted_runs)} measured runs ({', '.join(sources)})",
           "kept_at_base": result.kept, "fitted_on": result.fitted_runs,
           "leave_one_out_median_ape_pct": result.loo_medians(), "scale": result.scale}
    from kvsim.validation.run_set import _clean
    return _clean(doc)
