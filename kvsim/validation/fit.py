"""`kvsim calibrate`: fit named profile parameters to measured runs, with leave-one-out error.

Parameters (`kvsim.validation.fit_rows`): `gpu_time_scale` (GEMM and attention efficiency together:
the runs' end-to-end figures cannot tell them apart), `allreduce_delta_s` (collective latency),
`cpu_step_s` and `cpu_seq_s` (CPU time per step and per running sequence), fitted to each measured
stage's physical TPOT, per GPU (`fit_rows.fit_by_gpu`: the GPU-side two never carry to another GPU;
the CPU terms fall back to the fit over all GPUs where a GPU's rows are too few); then the client path
(`kvsim.validation.client_path.fit_client`): `client_fixed_s` from the TTFT of sustained HTTP-client
stages against the engine TTFT the fitted profile predicts (the engine's TTFT moves with the fitted
step time, so the client path is fitted after it, from TTFT rows, never from TPOT rows). Rows come from runs whose measured figures cover every request sent (no
failures: an overloaded in-process run counts, an HTTP run whose client gave up on requests does not, its
figures cover the successes only); TTFT rows from runs the server sustained. A parameter the runs cannot
fit is kept (GPU side: the base profile's value; CPU side: the all-GPU fit) and the reason is reported.

Leave-one-out: for each replayable run, fit on the others' rows (from the final iteration) and predict it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvsim.validation.client_path import HTTP_CLIENTS, ClientPath, fit_client
from kvsim.validation.compare import medians, rows as table_rows
from kvsim.validation.fit_rows import PARAMS, fit_by_gpu, params_of, rows_of, ttft_rows

#: The engine's own times: the client path is fitted apart, so the fitting replays add none.
NO_PATH = ClientPath(0.0, 0.0, "none (engine times)")


@dataclass
class CalibrationResult:
    """The fitted values per GPU ("" for a GPU without runs), what could not be fitted and why, the
    per-run replays with their leave-one-out predictions, and the wall time."""

    base: str
    by_gpu: dict
    client: ClientPath
    kept: dict
    fitted_runs: list
    replays: list = field(default_factory=list)
    wall_s: float = 0.0
    scale: float = 1.0

    @property
    def values(self) -> dict:
        """The values a GPU without runs takes."""
        return self.by_gpu[""]

    def loo_medians(self) -> dict:
        return medians(table_rows(self.replays, key="loo"))

    def default_medians(self) -> dict:
        return medians(table_rows(self.replays, key="predicted"))

    def to_dict(self) -> dict:
        from kvsim.validation.run_set import _clean
        return _clean({"base": self.base, "fitted": self.values, "by_gpu": {g: v for g, v in self.by_gpu.items() if g},
                       "client_path": self.client.to_dict(), "kept_at_base": self.kept, "fitted_on": self.fitted_runs,
                       "scale": self.scale, "median_ape_pct_default": self.default_medians(),
                       "median_ape_pct_leave_one_out": self.loo_medians(),
                       "runs": [r.to_dict() for r in self.replays], "wall_s": self.wall_s})

    def text(self) -> str:
        lines = [f"fitted on {len(self.fitted_runs)} runs (traces at {self.scale:g} of each stage):"]
        for gpu, values in self.by_gpu.items():
            kept = self.kept.get(gpu, {})
            lines.append(f" {gpu or 'any other GPU'}:")
            lines += [f"  {k} = {v:.6g}" + (f"  (not fitted: {kept[k]})" if k in kept else "") for k, v in values.items()]
        c, ck = self.client, self.kept.get("client", {})
        lines.append(f" client path: client_fixed_s = {c.fixed_s:.6g}" + (f"  (not fitted: {ck['client_fixed_s']})"
                                                                        if "client_fixed_s" in ck else ""))
        fmt = (lambda d: ", ".join(f"{k} {v:.1f}%" if v is not None else f"{k} -" for k, v in d.items()))
        lines.append(f"median APE, base profile: {fmt(self.default_medians())}")
        if any(r.loo for r in self.replays):
            lines.append(f"median APE, leave-one-out: {fmt(self.loo_medians())}")
        return "\n".join(lines)


def with_values(base, values: dict, name: str = "calibrated", by_gpu: dict | None = None):
    """`base` as a CalibratedProfile holding `values` (and per-GPU `by_gpu` {gpu: values})."""
    from kvsim.cost.profiles import CalibratedProfile
    fields = {k: v for k, v in base.to_dict().items() if k not in ("gpu_time_scale", "allreduce_delta_s", "by_gpu")}
    fields.update(name=name, variant="measured", cpu_step_s=values["cpu_step_s"], cpu_seq_s=values["cpu_seq_s"])
    rows = tuple((g, *(v[k] for k in PARAMS)) for g, v in sorted((by_gpu or {}).items()) if g)
    return CalibratedProfile(**fields, gpu_time_scale=values["gpu_time_scale"],
                             allreduce_delta_s=values["allreduce_delta_s"], by_gpu=rows)


def _profile(base, by_gpu: dict, name: str = "calibrated"):
    return with_values(base, by_gpu[""], name, by_gpu)


def covers_every_request(run) -> bool:
    """Whether the run's measured figures cover every request sent (no failed requests)."""
    return not run.measured[-1].get("failures")


def _simulate(run, profile, client, gpu, seed, scale):
    """(replay, TPOT rows, TTFT rows) of one run; a run kvsim cannot replay gives (replay, [], [])."""
    from kvsim.validation.replay import replay
    rep = replay(run, profile, client, gpu, seed, scale, keep=True)
    if rep.skip:
        return rep, [], []
    cfg, trace, stage_of, result = rep.parts
    rep.parts = ()
    if getattr(cfg.deployment, "dp", 1) > 1:     # several engines: no single step log to fit to
        return rep, [], []
    dep = cfg.deployment
    used = profile.for_gpu(dep.gpu.name) if getattr(profile, "by_gpu", ()) else profile
    rows = rows_of(run, result, trace, stage_of, used, dep.tp, dep.model.num_layers, dep.gpu.name)
    sustained = not run.overloaded and run.client in HTTP_CLIENTS
    return rep, rows, (ttft_rows(run, result, trace, stage_of) if sustained else [])


def calibrate(runs, base, gpu=None, seed: int = 0, scale: float = 0.25, loo: bool = True,
              progress=None, defaults=None) -> CalibrationResult:
    """Fit (module docstring); `base` an EngineProfile; `defaults`: the runs' replays under `base` at
    this `scale` when already made (else they are simulated here)."""
    say = progress or (lambda text: None)
    base_values = params_of(base)
    fit_runs = [r for r in runs if covers_every_request(r)]
    profile, by_gpu, why = base, {}, {}
    rows_by_run: dict = {}
    for it in range(2):                     # fit, then refit on rows from runs under the first fit
        rows_by_run = {}
        for run in fit_runs:
            rep, rows, _ = _simulate(run, profile, NO_PATH, gpu, seed, scale)
            if rows:
                rows_by_run[run.name] = rows
        rows = [row for group in rows_by_run.values() for row in group]
        if not rows:
            raise ValueError("no replayable run with a measured TPOT covering every request to fit to")
        by_gpu, why = fit_by_gpu(rows, base_values)
        profile = _profile(base, by_gpu)
        say(f"iteration {it + 1}: " + "; ".join(f"{g or 'other GPUs'} " + ", ".join(f"{k}={v:.4g}" for k, v in vals.items())
                                                for g, vals in by_gpu.items()))
    result_replays = defaults or [_simulate(run, base, ClientPath(), gpu, seed, scale)[0] for run in runs]
    ttft_by_run = {run.name: _simulate(run, profile, NO_PATH, gpu, seed, scale)[2] for run in runs
                   if not run.overloaded and run.client in HTTP_CLIENTS}
    client, client_why = fit_client([t for ts in ttft_by_run.values() for t in ts], ClientPath())
    kept = {**why, "client": client_why}
    result = CalibrationResult(base.name, by_gpu, client, kept, sorted(rows_by_run), result_replays, scale=scale)
    if loo:
        for i, run in enumerate(runs):
            rep = result_replays[i]
            if rep.skip:
                continue
            others = [row for name, group in rows_by_run.items() if name != run.name for row in group]
            prof = _profile(base, fit_by_gpu(others, base_values)[0], f"loo-{run.name}")
            path, _ = fit_client([t for name, ts in ttft_by_run.items() if name != run.name for t in ts], ClientPath())
            loo_rep, _, _ = _simulate(run, prof, path, gpu, seed, scale)
            rep.loo = loo_rep.predicted
            say(f"leave-one-out {i + 1}/{len(runs)}: {run.name}")
    return result


def profile_document(result: CalibrationResult, name: str, sources: list[str]) -> dict:
    """The engine-profile file (`--engine-profile FILE` reads base, cpu_step_s, cpu_seq_s,
    gpu_time_scale, allreduce_delta_s and by_gpu; `kvsim validate` also its client_path)."""
    doc = {"name": name, "base": result.base, **{k: result.values[k] for k in PARAMS},
           "by_gpu": {g: dict(v) for g, v in result.by_gpu.items() if g},
           "client_path": result.client.to_dict(),
           "source": f"kvsim calibrate on {len(result.fitted_runs)} measured runs ({', '.join(sources)})",
           "kept_at_base": result.kept, "fitted_on": result.fitted_runs,
           "leave_one_out_median_ape_pct": result.loo_medians(), "scale": result.scale}
    from kvsim.validation.run_set import _clean
    return _clean(doc)
