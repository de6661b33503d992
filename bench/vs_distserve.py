"""Covers: `kvsim run` against DistServe's SimPy simulator as whole processes on the same real trace.

Scenario: the first N requests (default 3,000) of the Azure LLM inference 2023 conversation trace
(`../shared/traces/azure_llm_2023_conv.csv`), OPT-13B. DistServe: `simdistserve.benchmarks.simulate_dist
--backend vllm` from the throwaway venv that `../shared/peers/README.md` describes
(`~/.cache/distserve-venv`), on the same arrivals and lengths as a JSON workload whose `start_time`s are
in SECONDS: its `load_workload` passes them to `convert_absolutearrival_to_interarrival`
(simdistserve/base/workload.py), which multiplies each gap by 1000 into its millisecond clock (times
written in ms would spread the requests 1000x apart, each decoding alone).

kvsim, two command lines:
- like for like (the ratio that counts): `kvsim run TRACE --max-requests N --quiet --engine-profile
  vllm-2023 --gpu a100-80gb`. DistServe's vLLM mode steps prompts or decodes, never both, without chunked
  prefill (simdistserve/base/worker.py `Worker.run`, `enable_chunked_prefill=False`), as kvsim's
  `vllm-2023` profile does; its OPT-13B step times are fitted on A100-80GB profiling (hence the GPU).
- default flags: `kvsim run TRACE --max-requests N --quiet` (vllm-v1: chunked prefill, prefix caching,
  one A100-40GB), shown beside it.

Both sides run with their bytecode cached (`PYTHONPYCACHEPREFIX` set to a scratch folder and one untimed
warm-up run each), as an installed package would be: this machine sets PYTHONDONTWRITEBYTECODE, which
would otherwise make every process compile its modules again. Runs alternate (kvsim, kvsim default,
DistServe, ...) so drift on a shared machine hits all; the table gives the median wall seconds and the
median CPU seconds (user + system of the child) of each. Without the venv DistServe is skipped.

Run: python bench/vs_distserve.py [--n 3000] [--repeats 3]
Target (issue 19): kvsim at least 20x faster at N = 3,000.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("KVSIM_SHARED", ROOT.parent / "shared"))   # ../shared beside the repo
TRACE = SHARED / "traces" / "azure_llm_2023_conv.csv"
DISTSERVE = SHARED / "peers" / "distserve"
VENV_PYTHON = Path.home() / ".cache" / "distserve-venv" / "bin" / "python"
LIKE_FOR_LIKE = ["--engine-profile", "vllm-2023", "--gpu", "a100-80gb"]


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one whole process (it must succeed)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def write_workload(path: Path, n: int) -> None:
    """The first `n` requests as DistServe's JSON workload, start times in seconds from the first."""
    from kvsim.trace.formats import load_trace

    trace = load_trace(TRACE).head(n)
    path.write_text(json.dumps([
        {"start_time": float(a), "prompt_len": int(p), "output_len": int(o)}
        for a, p, o in zip(trace.arrival_s, trace.prompt_tokens, trace.output_tokens)]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=3000, help="requests from the start of the trace")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs (median reported)")
    args = ap.parse_args()
    if not TRACE.exists():
        print(f"skipped: {TRACE} is not here")
        return
    sys.path.insert(0, str(ROOT))
    kvsim = [sys.executable, "-m", "kvsim.cli.app", "run", str(TRACE), "--max-requests", str(args.n), "--quiet"]
    sides = {"kvsim (vllm-2023, A100-80GB)": kvsim + LIKE_FOR_LIKE, "kvsim (default flags)": kvsim}
    have_peer = VENV_PYTHON.exists()
    if not have_peer:
        print(f"DistServe skipped: no venv at {VENV_PYTHON} (set-up: {SHARED / 'peers' / 'README.md'})")
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory() as tmp:
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        envs = {name: (ROOT, {**base, "PYTHONPATH": str(ROOT)}) for name in sides}
        if have_peer:
            workload = Path(tmp) / "d.json"
            write_workload(workload, args.n)
            sides["DistServe (vllm backend)"] = [
                str(VENV_PYTHON), "-m", "simdistserve.benchmarks.simulate_dist", "--backend", "vllm",
                "--model", "facebook/opt-13b", "--tp-prefill", "1", "--pp-prefill", "1",
                "--workload", str(workload), "--arrival", "custom", "--N", str(args.n)]
            envs["DistServe (vllm backend)"] = (DISTSERVE, {**base, "PYTHONPATH": str(DISTSERVE)})
            times["DistServe (vllm backend)"] = []
        for name, cmd in sides.items():         # warm-up: writes each side's bytecode once, untimed
            timed(cmd, *envs[name])
        for _ in range(args.repeats):
            for name, cmd in sides.items():
                times[name].append(timed(cmd, *envs[name]))
    print(f"N = {args.n:,} requests, {args.repeats} paired runs (median seconds, whole processes)")
    med = {name: (statistics.median(w for w, _ in t), statistics.median(c for _, c in t))
           for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:<30} wall {med[name][0]:6.2f} s  CPU {med[name][1]:6.2f} s   "
              f"(wall runs: {', '.join(f'{w:.2f}' for w, _ in t)})")
    peer = med.get("DistServe (vllm backend)")
    if peer:
        for name in list(times)[:2]:
            print(f"ratio DistServe / {name}: wall {peer[0] / med[name][0]:.1f}x, CPU {peer[1] / med[name][1]:.1f}x")


if __name__ == "__main__":
    main()
