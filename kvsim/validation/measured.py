"""Reading a measured run: what the server was, how to regenerate what the client sent, what it measured.

Three inputs (`read_run`):
- a folder in the format of `real-runs/` (README there): `server.json`, `workload.json` and/or
  `requests.jsonl`, `measured.json`;
- a `vllm bench serve --save-result` JSON (`kvsim.validation.bench`), with the server given apart;
- a per-request JSONL (one object per line: `arrival_s`, `prompt_tokens`, `output_tokens`, and the
  measured `ttft_ms`, `e2e_ms`), with the server given apart.
A missing or contradictory field is a `ValueError` naming the file and the field (the CLI: exit 2).
Times in the measured dicts are milliseconds, throughput requests per second.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.files import read_json_object
from kvsim.validation.run import CLIENTS, MeasuredRun  # noqa: F401  (re-exported: the readers' result)

def read_jsonl(path: Path) -> list[dict]:
    """One JSON object per non-blank line; errors name the file and line."""
    rows = []
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: cannot read: {exc}") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}:{n}: not JSON: {exc.msg}") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: expected a JSON object")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path}: no requests")
    return rows


def _stage_metrics(stage: dict, where: str) -> dict:
    """{metric: value} of one stage of a `measured.json` (means; ms; requests/s)."""
    out = {}
    for metric, key in (("e2e_ms", "e2e_ms"), ("ttft_ms", "ttft_ms"), ("itl_ms", "itl_ms"),
                        ("tpot_ms", "tpot_ms")):
        value = (stage.get(key) or {}).get("mean")
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


def read_folder(path: Path) -> MeasuredRun:
    """A run folder of `real-runs/` (server.json, workload.json and/or requests.jsonl, measured.json)."""
    for name in ("server.json", "measured.json"):
        if not (path / name).is_file():
            raise ValueError(f"{path}: missing {name}")
    server = read_json_object(path / "server.json", "server description")
    measured_doc = read_json_object(path / "measured.json", "measurements")
    workload = (read_json_object(path / "workload.json", "workload description")
                if (path / "workload.json").is_file() else {"generator": "trace replay"})
    requests: tuple = ()
    if (path / "requests.jsonl").is_file():
        requests = tuple(read_jsonl(path / "requests.jsonl"))
    elif "shared_prefix" not in str(workload.get("generator", "")):
        raise ValueError(f"{path}: workload.json field 'generator' is {workload.get('generator')!r} and there "
                         "is no requests.jsonl: cannot regenerate the requests")
    summary = measured_doc.get("summary")
    if not isinstance(summary, dict):
        raise ValueError(f"{path / 'measured.json'}: field 'summary' is missing")
    measured = {-1: _stage_metrics(summary, f"{path / 'measured.json'}: summary")}
    for stage in measured_doc.get("stages") or []:
        idx = stage.get("stage_index")
        measured[int(idx)] = _stage_metrics(stage, f"{path / 'measured.json'}: stage {idx}")
    client = "inference-perf" if "inference-perf" in str(workload.get("generator", "")) else "vllm-engine"
    generated = (workload.get("params") or {}).get("output_len")
    if client == "inference-perf" and generated:      # the physical TPOT from the measured means
        for stage in measured.values():
            stage["tpot_ms"] = (stage["e2e_ms"] - stage["ttft_ms"]) / (int(generated) - 1)
    if client == "vllm-engine" and not requests:
        raise ValueError(f"{path}: a trace-replay run needs requests.jsonl")
    pub = (measured_doc.get("published_simulator_predictions") or {}).get("by_simulator") or {}
    return MeasuredRun(name=path.name, source=str(path), server=server, workload=workload,
                       measured=measured, client=client, requests=requests,
                       overloaded=bool(measured_doc.get("overloaded")),
                       client_output_mean=(measured[-1].get("client_output_mean")
                                           if client == "inference-perf" else None),
                       published=pub)


def read_requests_jsonl(path: Path, server: dict) -> MeasuredRun:
    """A per-request JSONL (arrival_s, prompt_tokens, output_tokens, ttft_ms, e2e_ms per line; times
    from the engine's or the client's clock, said by an optional `client` field: vllm-engine or
    vllm-bench-serve) with the server description `server`."""
    from kvsim.validation.metrics import measured_from_requests
    rows = read_jsonl(path)
    client = str(rows[0].get("client", "vllm-engine"))
    measured = {-1: measured_from_requests(rows, str(path))}
    return MeasuredRun(name=path.stem, source=str(path), server=server, workload={"generator": "trace replay"},
                       measured=measured, client=client, requests=tuple(rows))


def read_run(path: str | Path, server_file: str | Path | None = None) -> MeasuredRun:
    """The measured run at `path`: a run folder, a `vllm bench serve` result JSON or a per-request JSONL
    (the last two need `server_file`: a server.json as in `real-runs/`)."""
    path = Path(path)
    if path.is_dir():
        return read_folder(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such run folder or file")
    if server_file is None:
        raise ValueError(f"{path}: a single file needs --server SERVER.json (the server's model, GPU and flags, "
                         "as real-runs/*/server.json)")
    server = read_json_object(Path(server_file), "server description")
    if path.suffix == ".jsonl":
        return read_requests_jsonl(path, server)
    from kvsim.validation.bench import read_bench_result
    return read_bench_result(path, server)
