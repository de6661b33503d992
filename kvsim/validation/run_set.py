"""Several measured runs replayed together: the profile and client path to use, the JSON document and
the text table `kvsim validate` prints."""

from __future__ import annotations

import json
import math
from pathlib import Path

from kvsim.validation.client_path import ClientPath
from kvsim.validation.compare import medians, medians_by, published, published_medians, rows, worst
from kvsim.validation.metrics import DEFINITIONS, ENGINE_DEFINITIONS, ENGINE_FORMULAS, ENGINE_METRICS, METRICS

FORMAT = "kvsim-validation/1"


def profile_and_path(name: str) -> tuple[object, ClientPath]:
    """(engine profile, client path) for `--engine-profile NAME`: a profile file from `kvsim calibrate`
    brings its fitted client path; any other profile takes the evidence default."""
    from kvsim.cost.profiles import get_profile
    profile = get_profile(name)
    path = Path(name)
    if path.suffix == ".json" and path.is_file():
        data = json.loads(path.read_text())
        return profile, ClientPath.from_dict(data.get("client_path"), str(path))
    return profile, ClientPath()


def read_runs(paths, server=None) -> list:
    """MeasuredRuns of `paths` (folders or files; a folder holding run folders is expanded)."""
    from kvsim.validation.inference_perf.folder import results_folder
    from kvsim.validation.measured import read_run
    out = []
    for p in map(Path, paths):
        if p.is_dir() and not (p / "server.json").exists() and results_folder(p) is None:
            subs = sorted(q for q in p.iterdir() if (q / "server.json").is_file())
            if not subs:
                raise ValueError(f"{p}: not a run folder (no server.json) and holds none")
            out += [read_run(q) for q in subs]
        else:
            out.append(read_run(p, server))
    return out


def replay_all(runs, profile=None, client_path=None, gpu=None, seed=0, scale=1.0, progress=None) -> list:
    """Replays of `runs` in order (`progress(i, replay)` after each)."""
    from kvsim.validation.replay import replay
    out = []
    for i, run in enumerate(runs):
        out.append(replay(run, profile, client_path, gpu, seed, scale))
        if progress:
            progress(i, out[-1])
    return out


def _clean(value):
    """Strict JSON: NaN and infinities become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def document(replays, profile_name: str, client_path: ClientPath, wall_s: float, key: str = "predicted") -> dict:
    """The `--json` document: per run and metric, medians (all, per GPU, per model), worst five,
    published simulators beside kvsim, the definitions each client's figures follow."""
    table = rows(replays, key=key)
    pub = published(replays)
    doc = {"format": FORMAT, "engine_profile": profile_name, "client_path": client_path.to_dict(),
           "stage": "whole run (stage_index -1), means", "runs": [r.to_dict() for r in replays],
           "table": table, "median_ape_pct": medians(table), "median_ape_pct_by_gpu": medians_by(replays, "gpu", key=key),
           "median_ape_pct_by_model": medians_by(replays, "model", key=key), "worst_runs": worst(replays, key=key),
           "published_simulators": {"rows": pub, "median_ape_pct": published_medians(pub)},
           "skipped": {r.name: r.skip for r in replays if r.skip},
           "median_ape_pct_engine": medians(table, ENGINE_METRICS),
           "metric_definitions": {**{c: DEFINITIONS[c] for c in sorted({r.client for r in replays})},
                                  "engine-side (vLLM request timestamps)": ENGINE_DEFINITIONS},
           "wall_s": wall_s}
    return _clean(doc)


def _fmt(v) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "-"
    return f"{v:,.1f}" if abs(v) < 1e5 else f"{v:,.0f}"


_SHORT = {"e2e_ms": "e2e ms", "ttft_ms": "TTFT ms", "itl_ms": "ITL ms", "tpot_ms": "TPOT ms",
          "throughput_rps": "req/s", "queue_ms": "queue ms", "engine_ttft_ms": "engine TTFT ms",
          "prefill_ms": "prefill ms", "decode_ms": "decode ms"}


def _block(replays, metrics, key: str, width: int, title: str) -> list[str]:
    from kvsim.validation.compare import ape
    lines = [title.ljust(width) + "".join(f" | {_SHORT[m]:>28}" for m in metrics),
             " " * width + "".join(f" | {'measured  predicted   err%':>28}" for _ in metrics)]
    for r in replays:
        if r.skip:
            lines.append(r.name.ljust(width) + f" | not replayed: {r.skip}")
            continue
        meas, pred = r.measured.get(-1, {}), (getattr(r, key) or {}).get(-1, {})
        lines.append(r.name.ljust(width) + "".join(
            f" | {_fmt(meas.get(m)):>9} {_fmt(pred.get(m)):>10} {_fmt(ape(meas.get(m), pred.get(m))):>7}"
            for m in metrics))
    med = medians(rows(replays, key=key), metrics)
    lines.append("median APE %".ljust(width) + "".join(f" | {_fmt(med[m]):>28}" for m in metrics))
    return lines


def text_table(replays, key: str = "predicted") -> str:
    """Plain-text tables: one line per run, measured / predicted / APE per metric, then the medians; the
    client's metrics, then the engine-side ones (measured where the input carries them); definitions."""
    width = max([len(r.name) for r in replays] + [12])
    lines = _block(replays, METRICS, key, width, "run")
    clients = sorted({r.client for r in replays})
    lines.append("Definitions: " + "; ".join(f"{c}: TTFT = {DEFINITIONS[c]['ttft_ms']}, ITL = {DEFINITIONS[c]['itl_ms']}"
                                              for c in clients))
    lines += [""] + _block(replays, ENGINE_METRICS, key, width, "engine side")
    lines.append("Engine-side definitions (vLLM's per-request timestamps, engine clock; kvsim: queued = arrival "
                 "at the engine, scheduled = first admission): " + "; ".join(
                     f"{_SHORT[m].removesuffix(' ms')} = {ENGINE_FORMULAS[m]}"
                     for m in ENGINE_METRICS))
    return "\n".join(lines)


def requests_csv(replays) -> str:
    """The predicted per-request times of every replayed run (`kvsim.validation.replay.request_times`),
    one CSV with a leading `run` column."""
    import pandas as pd
    frames = [pd.DataFrame({"run": r.name, **r.requests}) for r in replays if r.requests]
    if not frames:
        return ""
    return pd.concat(frames, ignore_index=True).to_csv(index=False, float_format="%.6f")
