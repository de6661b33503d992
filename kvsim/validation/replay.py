"""One measured run replayed through kvsim: regenerate the workload, run the server's configuration,
compute each metric as the client defines it.

`replay(run)` returns a `Replay` holding the measured and predicted metrics per stage (-1: the whole
run), the start-up KV blocks (predicted, and measured where known), the simulation's own figures that
explain a miss (mean batch, prefix-cache hit rate, whether the batch pinned at max_num_seqs), and `skip`
when the run cannot be replayed (no such GPU, data parallelism) with the reason in one line.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from kvsim.validation.client_path import ClientPath
from kvsim.validation.measured import MeasuredRun


@dataclass
class Replay:
    """A run's measured and predicted metrics ({stage: {metric: value}}); `loo` the prediction after
    leave-one-out calibration (filled by `kvsim.validation.fit`)."""

    name: str
    gpu: str
    model: str
    tp: int
    client: str
    measured: dict
    predicted: dict = field(default_factory=dict)
    loo: dict = field(default_factory=dict)
    published: dict = field(default_factory=dict)
    overloaded: bool = False
    skip: str = ""
    note: str = ""
    sim: dict = field(default_factory=dict)
    wall_s: float = 0.0
    parts: tuple = field(default=(), repr=False)    # (config, trace, stage_of, SimResult) when kept

    def to_dict(self) -> dict:
        def stages(d):
            return {str(k): v for k, v in d.items()}
        return {"run": self.name, "gpu": self.gpu, "model": self.model, "tp": self.tp, "client": self.client,
                "overloaded_measured": self.overloaded, "skip": self.skip or None, "note": self.note,
                "measured": stages(self.measured), "predicted": stages(self.predicted),
                "predicted_loo": stages(self.loo) or None, "sim": self.sim, "wall_s": self.wall_s}


def _shell(run: MeasuredRun) -> Replay:
    s = run.server
    return Replay(name=run.name, gpu=str(s.get("gpu", "?")), model=str(s.get("model", "?")),
                  tp=int(s.get("tensor_parallel_size", 1) or 1), client=run.client, measured=run.measured,
                  published=run.published, overloaded=run.overloaded)


def simulate_run(run: MeasuredRun, profile=None, client_path: ClientPath | None = None,
                 gpu: str | None = None, seed: int = 0, scale: float = 1.0):
    """(predicted {stage: metrics}, sim figures, (config, trace, stage of each request, SimResult)) of
    `run` under `profile` (name, file or EngineProfile; None: the default) with `client_path` (None: the
    evidence default)."""
    import kvsim
    from kvsim.validation.metrics import predicted
    from kvsim.validation.server import sim_config
    from kvsim.validation.workload import regenerate

    cfg = sim_config(run.server, f"{run.source}/server.json", profile, gpu)
    trace, stage_of = regenerate(run, cfg.cache.block_size, seed, scale)
    if cfg.deployment.dp > 1:       # vLLM's data-parallel engines behind its least-loaded balancer
        result = kvsim.simulate_fleet(trace, cfg, kvsim.FleetConfig(cfg.deployment.dp, "least-requests"))
    else:
        result = kvsim.simulate(trace, cfg)
    path = (client_path or ClientPath()).seconds(trace.prompt_tokens.astype(float), run.client)
    means = {}
    if run.client_output_mean is not None:
        means = {k: v["client_output_mean"] for k, v in run.measured.items() if "client_output_mean" in v}
    pred = predicted(result, trace, stage_of, path, means)
    s = result.summary
    seqs = cfg.batch_limits()[0]
    figures = {"requests": len(trace), "finished": s["requests_finished"], "kv_blocks": s["kv"]["num_blocks"],
               "mean_batch": s["mean_batch_size"], "max_num_seqs": seqs,
               "prefix_cache_hit_rate": s["prefix_cache_hit_rate"],
               "limited_by_max_num_seqs": s["limited_by"]["max_num_seqs"],
               "engine_profile": s["engine_profile"]}
    return pred, figures, (cfg, trace, stage_of, result)


def replay(run: MeasuredRun, profile=None, client_path: ClientPath | None = None, gpu: str | None = None,
           seed: int = 0, scale: float = 1.0, keep: bool = False) -> Replay:
    """`run` replayed (module docstring); a run kvsim cannot express comes back with `skip` set.
    `keep`: the replay keeps the simulation's parts (`Replay.parts`) for calibration."""
    from kvsim.validation.server import NotReplayable
    out = _shell(run)
    start = time.perf_counter()
    try:
        out.predicted, out.sim, parts = simulate_run(run, profile, client_path, gpu, seed, scale)
    except NotReplayable as exc:
        out.skip = str(exc)
        return out
    out.wall_s = time.perf_counter() - start
    if keep:
        out.parts = parts
    known = (run.server.get("measured_kv_blocks") or {}).get("gpu_blocks")
    if known:
        out.sim["kv_blocks_measured"] = int(known)
    out.note = explain(out)
    return out


def explain(r: Replay) -> str:
    """A one-line reason for a large miss, from the simulation's own figures."""
    notes = []
    pinned = r.sim.get("limited_by_max_num_seqs", 0) > 0.2 or r.sim.get("mean_batch", 0) >= 0.9 * r.sim.get("max_num_seqs", 1e9)
    if pinned and not r.overloaded:
        notes.append("kvsim overloads (batch pinned at max_num_seqs) where the server kept up")
    elif r.overloaded:
        notes.append("overloaded run: measured metrics cover successes only")
    m, p = r.measured.get(-1, {}), r.predicted.get(-1, {})
    if m.get("tpot_ms") and p.get("tpot_ms"):
        notes.append(f"decode {p['tpot_ms']:.1f} ms/token predicted vs {m['tpot_ms']:.1f} measured")
    return "; ".join(notes)
