"""Approximate replay of the 16 H100 inference-perf runs in ../shared/real-runs (development aid for the
vllm-v1 time model; the full replay command is `kvsim validate`). Prints per run and stage: measured and
predicted mean TTFT and the per-token decode time ITL = (mean e2e - mean TTFT) / (output_len - 1), with
the absolute percentage errors and their medians. Usage: python bench/real_runs_h100.py [NAME_FILTER]
[--profile P]. The trace: 100 prompts (10 groups sharing a system prompt), request i sends prompt i mod
100, constant arrivals per stage, back to back; prompt lengths scaled to the measured mean."""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu
from kvsim.specs.hf.config import load_hf_config
from kvsim.trace.table import Trace

RUNS = Path(__file__).resolve().parents[2] / "shared" / "real-runs"
if not RUNS.exists():
    RUNS = Path("/work/shared/real-runs")


def trace_for(work: dict, block: int = 16) -> tuple[Trace, list[tuple[float, float, int]]]:
    p = work["params"]
    sys_len, q_len, out = p["system_prompt_len"], p["question_len"], p["output_len"]
    ratio = work["measured_prompt_len"][0]["mean"] / (sys_len + q_len)
    s_tok, q_tok = round(sys_len * ratio), round(q_len * ratio)
    prompts = []
    for g in range(p["num_groups"]):
        for k in range(p["num_prompts_per_group"]):
            n = s_tok + 1 + q_tok
            hashes = [(g * 1000 + j) if (j + 1) * block <= s_tok else (10**6 + (g * 100 + k) * 1000 + j)
                      for j in range(n // block)]
            prompts.append((n, hashes))
    rng = np.random.default_rng(0)
    order = rng.permutation(len(prompts))
    arr, pt, ot, hs, stages, t0, i = [], [], [], [], [], 0.0, 0
    for st in work["arrival"]["stages"]:
        n = int(st["rate"] * st["duration_s"])
        stages.append((t0, t0 + st["duration_s"], i))
        for j in range(n):
            n_tok, h = prompts[order[i % len(prompts)]]
            arr.append(t0 + j / st["rate"]); pt.append(n_tok); ot.append(out); hs.append(h); i += 1
        t0 += st["duration_s"]
    return Trace.from_arrays(arr, pt, ot, block_hashes=hs, hash_block_size=block), stages


def replay(folder: Path, profile: str) -> list[dict]:
    server = json.loads((folder / "server.json").read_text())
    work = json.loads((folder / "workload.json").read_text())
    meas = json.loads((folder / "measured.json").read_text())
    fl = server["flags"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(server["hf_config"]))
        spec = load_hf_config(Path(tmp) / "config.json").with_max_model_len(fl["max_model_len"])
    cfg = SimConfig(Deployment(spec, get_gpu("h100-80gb"), server["tensor_parallel_size"]),
                    CacheConfig(block_size=16, gpu_mem_util=fl["gpu_memory_utilization"], cpu_kv_gib=8.0, cpu_kv_policy=POLICY),
                    SchedulerConfig(fl["max_num_seqs"], fl["max_num_batched_tokens"], True),
                    engine_profile=profile)
    tr, stages = trace_for(work)
    res = simulate(tr, cfg, keep_steps=False)
    rc = res.request_columns
    out_len = work["params"]["output_len"]
    rows = []
    for (t0, t1, first), st in zip(stages, meas["stages"]):
        arr = np.asarray(tr.arrival_s)
        sel = (arr >= t0) & (arr < t1) & np.isfinite(rc["finished_s"])
        ttft = float(np.mean(rc["first_token_s"][sel] - arr[sel])) * 1e3
        e2e = float(np.mean(rc["finished_s"][sel] - arr[sel])) * 1e3
        m_ttft, m_e2e = st["ttft_ms"]["mean"], st["e2e_ms"]["mean"]
        rows.append(dict(run=folder.name, stage=st["stage_index"], rate=st["rate"],
                         ttft=(m_ttft, ttft), itl=((m_e2e - m_ttft) / (out_len - 1), (e2e - ttft) / (out_len - 1)),
                         e2e=(m_e2e, e2e), batch=res.summary["mean_batch_size"]))
    return rows


#: vLLM's OffloadingConnector stores every computed block (kvsim/alloc/cpu_tier.py "store-all")
POLICY = "store-all"
GPU_NAMES = {"H100-SXM-80GB": "h100-80gb", "RTX-4090-24GB": "rtx-4090", "RTX-PRO-6000-Blackwell-96GB": "rtx-pro-6000"}


def replay_requests(folder: Path, profile: str) -> list[dict]:
    """An LLMServingSim run (per-request arrivals and lengths; engine-side TTFT, no client path)."""
    from kvsim.fleet.config import FleetConfig
    from kvsim.fleet.sim import simulate_fleet
    server = json.loads((folder / "server.json").read_text())
    meas = json.loads((folder / "measured.json").read_text())["summary"]
    reqs = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines() if line.strip()]
    fl = server["flags"]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config.json").write_text(json.dumps(server["hf_config"]))
        spec = load_hf_config(Path(tmp) / "config.json")
    if isinstance(fl["max_model_len"], int):
        spec = spec.with_max_model_len(fl["max_model_len"])
    dep = Deployment(spec, get_gpu(GPU_NAMES[server["gpu"]]), server["tensor_parallel_size"],
                     server["data_parallel_size"], bool(server.get("enable_expert_parallel")))
    cfg = SimConfig(dep, CacheConfig(block_size=16, gpu_mem_util=0.9),
                    SchedulerConfig(fl["max_num_seqs"], fl["max_num_batched_tokens"], True), engine_profile=profile)
    tr = Trace.from_arrays([r["arrival_s"] for r in reqs], [r["prompt_tokens"] for r in reqs],
                           [r["output_tokens"] for r in reqs])
    if dep.dp > 1:
        res = simulate_fleet(tr, cfg, FleetConfig(dep.dp, "least-requests"))
        rc = res.request_columns
    else:
        rc = simulate(tr, cfg, keep_steps=False).request_columns
    arr = np.asarray(tr.arrival_s)
    ttft = float(np.mean(rc["first_token_s"] - arr)) * 1e3
    e2e = float(np.mean(rc["finished_s"] - arr)) * 1e3
    out = float(np.mean([r["output_tokens"] for r in reqs]))
    m_ttft, m_e2e = meas["ttft_ms"]["mean"], meas["e2e_ms"]["mean"]
    return [dict(run=folder.name, stage=-1, rate=0, ttft=(m_ttft, ttft), e2e=(m_e2e, e2e),
                 itl=((m_e2e - m_ttft) / (out - 1), (e2e - ttft) / (out - 1)), batch=float("nan"))]


def main() -> None:
    args = sys.argv[1:]
    profile = "vllm-v1"
    global POLICY
    if "--cpu-kv-policy" in args:
        k = args.index("--cpu-kv-policy"); POLICY = args[k + 1]; del args[k:k + 2]
    if "--profile" in args:
        k = args.index("--profile"); profile = args[k + 1]; del args[k:k + 2]
    filt = args[0] if args else "h100"
    ape = {"ttft": [], "itl": [], "e2e": []}
    for folder in sorted(RUNS.iterdir()):
        if not folder.is_dir() or filt not in folder.name:
            continue
        for r in (replay(folder, profile) if folder.name.startswith("h100") else replay_requests(folder, profile)):
            line = f"{r['run']:40s} st{r['stage']} {r['rate']:>3}/s batch {r['batch']:6.1f}"
            for k in ("itl", "ttft", "e2e"):
                m, p = r[k]
                e = abs(p - m) / m * 100
                ape[k].append(e)
                line += f" | {k} {m:9.1f} {p:9.1f} {e:6.0f}%"
            print(line, flush=True)
    print("median APE over stages: " + ", ".join(f"{k} {statistics.median(v):.1f}%" for k, v in ape.items() if v))


if __name__ == "__main__":
    main()
