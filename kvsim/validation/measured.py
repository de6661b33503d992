"""Reading a measured run: what the server was, how to regenerate what the client sent, what it measured.

Three inputs (`read_run`):
- a folder in the format of `real-runs/` (README there): `server.json`, `workload.json` and/or
  `requests.jsonl`, `measured.json`;
- a `vllm bench serve --save-result` JSON (`kvsim.validation.bench`), with the server given apart;
- a per-request JSONL (one object per line: `arrival_s`, `prompt_tokens`, `output_tokens`, and the
  measured `ttft_ms`, `e2e_ms`; engine-side times where it has them: `queue_ms`, or vLLM's
  `queued_ts`, `scheduled_ts`, `first_token_ts`, `last_token_ts`), with the server given apart;
- an inference-perf report folder (`kvsim.validation.inference_perf`), with its server.json.
A missing or contradictory field is a `ValueError` naming the file and the field (the CLI: exit 2).
Times in the measured dicts are milliseconds, throughput requests per second.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.files import read_json_object
from kvsim.validation.run import CLIENTS, MeasuredRun, run_from_documents  # noqa: F401  (re-exported)

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
    return run_from_documents(path, server, workload, measured_doc, requests)


def read_requests_jsonl(path: Path, server: dict) -> MeasuredRun:
    """A per-request JSONL (arrival_s, prompt_tokens, output_tokens, ttft_ms, e2e_ms per line; times
    from the engine's or the client's clock, said by an optional `client` field: vllm-engine or
    vllm-bench-serve) with the server description `server`."""
    from kvsim.validation.metrics import engine_from_requests, measured_from_requests
    rows = read_jsonl(path)
    client = str(rows[0].get("client", "vllm-engine"))
    measured = {-1: {**measured_from_requests(rows, str(path)), **engine_from_requests(rows, client, str(path))}}
    return MeasuredRun(name=path.stem, source=str(path), server=server, workload={"generator": "trace replay"},
                       measured=measured, client=client, requests=tuple(rows))


def read_run(path: str | Path, server_file: str | Path | None = None) -> MeasuredRun:
    """The measured run at `path`: a run folder, an inference-perf report folder, a `vllm bench serve`
    result JSON or a per-request JSONL (the last two need `server_file`: a server.json as in
    `real-runs/`; the inference-perf folder takes it or holds one)."""
    path = Path(path)
    if path.is_dir():
        from kvsim.validation.inference_perf.folder import read_report_folder, results_folder
        if not (path / "measured.json").is_file() and results_folder(path) is not None:
            server = read_json_object(Path(server_file), "server description") if server_file else None
            return read_report_folder(path, server)
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
