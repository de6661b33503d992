"""An inference-perf report folder (kubernetes-sigs/inference-perf) as a `MeasuredRun`.

The folder (or its `results/` subfolder) holds what inference-perf writes with `report.request_lifecycle`
summary and per-stage reports on: `config.yaml` (the configuration it resolved), `stage_<N>_lifecycle_metrics.json`
per load stage N = 0, 1, ... and `summary_lifecycle_metrics.json` (the whole run). Each lifecycle report
is {load_summary: {count, requested_rate, achieved_rate, ...}, successes: {count, latency:
{request_latency, time_to_first_token, time_per_output_token, inter_token_latency,
normalized_time_per_output_token}, each {mean, min, p0.1, ..., median, ..., p99.9, max} in seconds,
throughput: {requests_per_sec, input_tokens_per_sec, output_tokens_per_sec, total_tokens_per_sec},
prompt_len, output_len (client-side token counts)}, failures: {count, ...}}.

Mapped as real-runs/README.md maps the sixteen H100 runs (inference-sim/training `default_args/`):
seconds to ms; `itl_ms` = (mean request_latency - mean time_to_first_token) / (mean output_len - 1),
the sim-to-real study's ITL; stage rate and duration from `config.yaml` `load.stages`; `count` the
successes; `overloaded` when the summary counts failures (it does for exactly the four reasoning runs
there). Workload: `data.type` shared_prefix with `data.shared_prefix` {num_groups,
num_prompts_per_group, system_prompt_len, question_len, output_len}, `load.type` constant or poisson;
the measured prompt lengths per stage become `measured_prompt_len` (`kvsim.validation.workload`).
The server (model, hf_config, GPU, flags) is a server.json as in real-runs/, given with --server or
lying in the folder. A missing or contradictory field is a ValueError naming the file and field.
"""

from __future__ import annotations

import re
from pathlib import Path

from kvsim.files import read_json_object
from kvsim.validation.run import MeasuredRun, run_from_documents

CONFIG, SUMMARY = "config.yaml", "summary_lifecycle_metrics.json"
#: real-runs' measured.json names of inference-perf's latency reports (seconds there, ms here).
LATENCIES = (("e2e_ms", "request_latency"), ("ttft_ms", "time_to_first_token"),
             ("tpot_ms_inference_perf", "time_per_output_token"),
             ("inter_token_latency_ms_inference_perf", "inter_token_latency"))
SHARED_PREFIX = ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len")


def results_folder(path: Path) -> Path | None:
    """The folder holding the lifecycle reports: `path/results` or `path` itself; None if neither."""
    for folder in (path / "results", path):
        if (folder / SUMMARY).is_file():
            return folder
    return None


def _get(doc: dict, dotted: str, where: str, kind=None):
    value = doc
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if value is None:
        raise ValueError(f"{where}: field {dotted!r} is missing")
    if kind is not None and (isinstance(value, bool) or not isinstance(value, kind)):
        raise ValueError(f"{where}: field {dotted!r} must be {getattr(kind, '__name__', 'a number')}, got {value!r}")
    return value


def workload_of(config: dict, where: str) -> dict:
    """The workload (real-runs' workload.json shape) of a resolved inference-perf `config.yaml`."""
    kind = _get(config, "data.type", where)
    if kind != "shared_prefix":
        raise ValueError(f"{where}: field 'data.type' is {kind!r}: kvsim regenerates inference-perf's "
                         "shared_prefix data only")
    params = {}
    for key in SHARED_PREFIX:
        params[key] = _get(config, f"data.shared_prefix.{key}", where, int)
        if params[key] < 1:
            raise ValueError(f"{where}: field 'data.shared_prefix.{key}' must be >= 1, got {params[key]}")
    if config["data"]["shared_prefix"].get("enable_multi_turn_chat"):
        raise ValueError(f"{where}: field 'data.shared_prefix.enable_multi_turn_chat' is true: multi-turn "
                         "conversations are not regenerated")
    if (config.get("server") or {}).get("ignore_eos") is False:
        raise ValueError(f"{where}: field 'server.ignore_eos' is false: the generated output lengths are "
                         "unknown (kvsim replays output_len tokens per request)")
    load = _get(config, "load.type", where, str)
    if load not in ("constant", "poisson"):
        raise ValueError(f"{where}: field 'load.type' is {load!r}: known constant, poisson")
    stages = _get(config, "load.stages", where, list)
    if not stages:
        raise ValueError(f"{where}: field 'load.stages' is empty")
    out = []
    for k, stage in enumerate(stages):
        rate = _get(stage, "rate", f"{where}: load.stages[{k}]", (int, float))
        span = _get(stage, "duration", f"{where}: load.stages[{k}]", (int, float))
        if not (rate > 0 and span > 0):
            raise ValueError(f"{where}: load.stages[{k}]: rate and duration must be > 0, got {rate} and {span}")
        out.append({"rate": rate, "duration_s": span})
    params["ignore_eos"] = True
    api = config.get("api")
    if isinstance(api, dict) and api.get("type") in ("completion", "chat"):
        params["api"] = (("streaming " if api.get("streaming") else "")
                         + ("/v1/completions" if api["type"] == "completion" else "/v1/chat/completions"))
    return {"generator": "inference-perf shared_prefix (kubernetes-sigs/inference-perf), from results/config.yaml",
            "params": params, "arrival": {"type": load, "stages": out}, "seed": None}


def stage_document(report: dict, where: str, index: int, stage: dict | None) -> dict:
    """One lifecycle report in the shape of a real-runs measured.json stage (ms); `stage` the
    configured {rate, duration_s} (None for the summary)."""
    out: dict = {"stage_index": index, "count": _get(report, "successes.count", where, int),
                 "failures": int((report.get("failures") or {}).get("count") or 0)}
    latency = _get(report, "successes.latency", where, dict)
    for name, key in LATENCIES:
        values = latency.get(key)
        if values is None and key in ("request_latency", "time_to_first_token"):
            raise ValueError(f"{where}: field 'successes.latency.{key}' is missing")
        if values is not None:
            _get(values, "mean", f"{where}: successes.latency.{key}", (int, float))
            out[name] = {q: v * 1e3 for q, v in values.items() if isinstance(v, (int, float))}
    out["throughput"] = dict(_get(report, "successes.throughput", where, dict))
    for key in ("prompt_len", "output_len"):
        if isinstance(report["successes"].get(key), dict):
            out[key] = dict(report["successes"][key])
    counted = (out.get("output_len") or {}).get("mean")
    if counted is not None and counted > 1:
        out["itl_ms"] = {"mean": (out["e2e_ms"]["mean"] - out["ttft_ms"]["mean"]) / (counted - 1)}
    load = report.get("load_summary") or {}
    out["achieved_rate"] = load.get("achieved_rate")
    if stage is not None:
        requested = load.get("requested_rate")
        if requested is not None and abs(float(requested) - stage["rate"]) > 1e-9 * stage["rate"]:
            raise ValueError(f"{where}: field 'load_summary.requested_rate' ({requested}) contradicts "
                             f"config.yaml load.stages[{index}].rate ({stage['rate']})")
        out.update(stage)
    return out


def read_report_folder(path: Path, server: dict | None) -> MeasuredRun:
    """The inference-perf report folder at `path` (module docstring) with `server` (None: the folder's
    own server.json)."""
    results = results_folder(path)
    if results is None:
        raise ValueError(f"{path}: no {SUMMARY} (here or in results/): not an inference-perf report folder")
    if not (results / CONFIG).is_file():
        raise ValueError(f"{results}: missing {CONFIG} (inference-perf's resolved configuration)")
    from kvsim.validation.inference_perf.yaml_subset import loads
    try:
        config = loads((results / CONFIG).read_text(), str(results / CONFIG))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{results / CONFIG}: cannot read: {exc}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{results / CONFIG}: expected a mapping")
    root = path.parent if results == path and path.name == "results" else path
    if server is None:
        if not (root / "server.json").is_file():
            raise ValueError(f"{root}: an inference-perf report folder needs --server SERVER.json (the server's "
                             "model, hf_config, GPU and vLLM flags, as real-runs/*/server.json) or a server.json in it")
        server = read_json_object(root / "server.json", "server description")
    model = (config.get("server") or {}).get("model_name")
    if model and server.get("model") and str(model).lower() != str(server["model"]).lower():
        raise ValueError(f"{results / CONFIG}: field 'server.model_name' ({model}) contradicts the server "
                         f"description's model ({server['model']})")
    workload = workload_of(config, str(results / CONFIG))
    stages = workload["arrival"]["stages"]
    found = sorted(int(m.group(1)) for p in results.iterdir()
                   if (m := re.fullmatch(r"stage_(\d+)_lifecycle_metrics\.json", p.name)))
    extra = [k for k in found if k >= len(stages)]
    if extra:
        raise ValueError(f"{results}/stage_{extra[0]}_lifecycle_metrics.json: config.yaml field 'load.stages' "
                         f"has {len(stages)} stage(s)")
    docs = []
    for k, stage in enumerate(stages):
        file = results / f"stage_{k}_lifecycle_metrics.json"
        if len(stages) > 1 and not file.is_file():
            raise ValueError(f"{file}: missing (config.yaml field 'load.stages' has {len(stages)} stages)")
        if file.is_file():
            docs.append(stage_document(read_json_object(file, "lifecycle metrics"), str(file), k, stage))
    summary_file = results / SUMMARY
    summary = stage_document(read_json_object(summary_file, "lifecycle metrics"), str(summary_file), -1, None)
    if docs and sum(d["count"] for d in docs) != summary["count"]:
        raise ValueError(f"{summary_file}: field 'successes.count' ({summary['count']}) is not the stages' sum "
                         f"({sum(d['count'] for d in docs)})")
    workload["measured_prompt_len"] = [{"stage_index": d["stage_index"], **d["prompt_len"]}
                                       for d in (docs or [summary]) if "prompt_len" in d] or None
    measured_doc = {"summary": summary, "stages": docs, "overloaded": summary["failures"] > 0}
    return run_from_documents(path, server, workload, measured_doc, name=root.resolve().name,
                              measured_file=str(summary_file.relative_to(path)))
