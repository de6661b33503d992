"""`MeasuredRun`: one measured run as the readers (`kvsim.validation.measured`, `kvsim.validation.bench`,
`kvsim.validation.inference_perf`) give it, and how a document in the shape of real-runs' `measured.json`
becomes one (`run_from_documents`). Times in the measured dicts are milliseconds, throughput requests per
second."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

#: The clients whose metric definitions kvsim follows (`kvsim.validation.metrics`).
CLIENTS = ("inference-perf", "vllm-engine", "vllm-bench-serve")


@dataclass(frozen=True)
class MeasuredRun:
    """One measured run. `server`: the `server.json` object (model, hf_config, gpu, TP/DP, flags);
    `workload`: how to regenerate the requests (`kvsim.validation.workload`); `requests`: per-request
    rows when the client sent a known list (arrival_s, prompt_tokens, output_tokens, measured times);
    `measured`: {stage index: {metric: value}} with -1 the whole run (metric names of
    `kvsim.validation.metrics.METRICS`); `client`: one of CLIENTS; `client_output_mean`: the client's own
    mean count of output tokens (inference-perf re-tokenizes the stream) where it differs from what the
    server generated; `published`: other simulators' predictions of this run ({simulator: {key: value}})."""

    name: str
    source: str
    server: dict
    workload: dict
    measured: dict
    client: str
    requests: tuple = ()
    overloaded: bool = False
    client_output_mean: float | None = None
    published: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"{self.source}: unknown client {self.client!r}; known: {', '.join(CLIENTS)}")
        if -1 not in self.measured:
            raise ValueError(f"{self.source}: no whole-run measurements (stage_index -1)")


def stage_metrics(stage: dict, where: str) -> dict:
    """{metric: value} of one stage of a `measured.json` (means; ms; requests/s)."""
    out = {}
    for metric in ("e2e_ms", "ttft_ms", "itl_ms", "tpot_ms"):
        value = (stage.get(metric) or {}).get("mean")
        if value is not None:
            out[metric] = float(value)
    tput = (stage.get("throughput") or {}).get("requests_per_sec")
    if tput is not None:
        out["throughput_rps"] = float(tput)
    for key in ("rate", "duration_s", "count", "failures"):
        if stage.get(key) is not None:
            out[key] = stage[key]
    out_len = (stage.get("output_len") or {}).get("mean")
    if out_len is not None:
        out["client_output_mean"] = float(out_len)
    if "e2e_ms" not in out or "ttft_ms" not in out:
        raise ValueError(f"{where}: needs e2e_ms.mean and ttft_ms.mean")
    return out


def run_from_documents(path, server: dict, workload: dict, measured_doc: dict, requests: tuple = (),
                       name: str | None = None, measured_file: str = "measured.json") -> MeasuredRun:
    """The `MeasuredRun` of a run folder's documents: `measured_doc` in the shape of real-runs'
    `measured.json` (`summary`, `stages`, `overloaded`, `published_simulator_predictions`); the client
    follows from the workload's generator (inference-perf, else the vLLM engine clock). inference-perf
    runs get the physical TPOT, (mean e2e - mean TTFT) / (output_len - 1) with the generated count; runs
    whose request rows carry engine-side times get the engine metrics (`kvsim.validation.metrics`)."""
    from kvsim.validation.metrics import engine_from_requests
    where = f"{path}/{measured_file}"
    summary = measured_doc.get("summary")
    if not isinstance(summary, dict):
        raise ValueError(f"{where}: field 'summary' is missing")
    measured = {-1: stage_metrics(summary, f"{where}: summary")}
    for stage in measured_doc.get("stages") or []:
        idx = stage.get("stage_index")
        measured[int(idx)] = stage_metrics(stage, f"{where}: stage {idx}")
    client = "inference-perf" if "inference-perf" in str(workload.get("generator", "")) else "vllm-engine"
    generated = (workload.get("params") or {}).get("output_len")
    if client == "inference-perf" and generated:      # the physical TPOT from the measured means
        for stage in measured.values():
            stage["tpot_ms"] = (stage["e2e_ms"] - stage["ttft_ms"]) / (int(generated) - 1)
    if client == "vllm-engine" and not requests:
        raise ValueError(f"{path}: a trace-replay run needs requests.jsonl")
    if requests:
        measured[-1].update(engine_from_requests(requests, client, f"{path}/requests.jsonl"))
    pub = (measured_doc.get("published_simulator_predictions") or {}).get("by_simulator") or {}
    return MeasuredRun(name=name or Path(path).name, source=str(path), server=server, workload=workload,
                       measured=measured, client=client, requests=requests,
                       overloaded=bool(measured_doc.get("overloaded")),
                       client_output_mean=(measured[-1].get("client_output_mean")
                                           if client == "inference-perf" else None),
                       published=pub)
