"""Covers: the simulator's wall time on hybrid models (sliding window, chunked local, MLA, Mamba layers;
vLLM's hybrid KV cache manager) with default `kvsim run` flags, this tree against an older commit, side by
side in one run (issue 19 item 3: hybrid models on the lazy decode fast path).

Scenario: the ShareGPT-like preset (seed 0) at `--rates` requests/s for `--duration` seconds, each model
on H100-80GB at the TP degree given in --models (MODEL:TP:MAX_MODEL_LEN[:hybrid], `hybrid` turning
vLLM's hybrid manager on where its default is off: Llama 4), default flags otherwise (profile `vllm-v1`:
chunked prefill, prefix caching where the model allows it). Each run is a fresh process; runs alternate
old, new, old, new, ... The old tree is `git archive` of `--old` unpacked under /tmp if missing. Each run
prints a digest of its step rows, request records and summary: both trees must compute the same thing.
Times: `sim_wall_s` (the run's wall time) and the process's CPU time over `simulate` (imports included
in both; on a shared machine the CPU time drifts less). Speed-ups are medians of the pairs' ratios.

Run: python bench/hybrid_vs_old.py [--old aa1d257] [--repeats 3] [--duration 600] [--rates 2,10]
     [--models gpt-oss-120b:1:32768,gemma-3-27b:1:32768,llama-4-scout:4:32768:hybrid,...] [--samples 1]
`--samples N` gives every request N parallel samples (issue 19 item 1; full-attention models only, e.g.
--models llama-3-8b:1:8192: the hybrid manager serves one sequence per request).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from speed_vs_old import ROOT, old_tree  # noqa: E402

# (DeepSeek-V3's MLA is one group of latents on the plain paged pool, on the lazy path before; its
# weights do not fit 8 x H100-80GB)
MODELS = ("gpt-oss-120b:1:32768,gemma-3-27b:1:32768,llama-4-scout:4:32768:hybrid,llama-4-scout:4:32768,"
          "qwen3-next-80b-a3b:4:32768")

ONE = r"""
import hashlib, json, sys, time
import kvsim
model, tp, max_len, rate, duration, hybrid, n = (sys.argv[1], int(sys.argv[2]), int(sys.argv[3]),
                                                 float(sys.argv[4]), float(sys.argv[5]), sys.argv[6] == "1",
                                                 int(sys.argv[7]))
trace = kvsim.generate_trace("sharegpt", rate_rps=rate, duration_s=duration, seed=0, n=n)
flags = {"hybrid_kv_cache": True} if hybrid else {}
cpu = time.process_time()
r = kvsim.simulate(trace, model=model, gpu="h100-80gb", tp=tp, max_model_len=max_len, **flags)
cpu = time.process_time() - cpu
s = dict(r.summary)
wall = s.pop("sim_wall_s")
digest = hashlib.sha256()
digest.update(r.steps.to_csv().encode())
digest.update(r.requests.to_csv().encode())
digest.update(json.dumps(s, sort_keys=True, default=str).encode())
print(json.dumps({"wall": wall, "cpu": cpu, "steps": s["engine_steps"], "batch": s["mean_batch_size"],
                  "digest": digest.hexdigest()[:12]}))
"""


def run_one(tree: Path, item: str, rate: float, duration: float, samples: int) -> dict:
    name, tp, max_len, *hybrid = item.split(":")
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", ONE, name, tp, max_len, str(rate), str(duration),
                          "1" if hybrid else "0", str(samples)], env=env, cwd=tree, check=True, text=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="aa1d257", help="commit to compare against")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs per model and rate (median reported)")
    ap.add_argument("--duration", type=float, default=600.0, help="trace length, seconds")
    ap.add_argument("--rates", default="2,10", help="comma-separated request rates, requests/s")
    ap.add_argument("--models", default=MODELS, help="MODEL:TP:MAX_MODEL_LEN[:hybrid],...")
    ap.add_argument("--samples", type=int, default=1, help="parallel samples (n) of every request")
    args = ap.parse_args()
    old = old_tree(args.old)
    print(f"old = {args.old} ({old}), new = {ROOT}; ShareGPT-like {args.duration:g} s, n = {args.samples}; "
          f"{args.repeats} paired runs, median sim_wall_s")
    print("model | req/s | steps | mean batch | old wall s | new wall s | wall speed-up | old CPU s | new CPU s | "
          "CPU speed-up | same outputs")
    for item in args.models.split(","):
        for rate in map(float, args.rates.split(",")):
            olds, news = [], []
            for _ in range(args.repeats):
                olds.append(run_one(old, item, rate, args.duration, args.samples))
                news.append(run_one(ROOT, item, rate, args.duration, args.samples))
            ratio = statistics.median(o["wall"] / n["wall"] for o, n in zip(olds, news))
            cpu_ratio = statistics.median(o["cpu"] / n["cpu"] for o, n in zip(olds, news))
            same = len({r["digest"] for r in olds + news}) == 1
            print(f"{item} | {rate:g} | {news[0]['steps']:,} | {news[0]['batch']:.1f} | "
                  f"{statistics.median(r['wall'] for r in olds):.2f} | {statistics.median(r['wall'] for r in news):.2f} | "
                  f"{ratio:.2f}x | {statistics.median(r['cpu'] for r in olds):.2f} | "
                  f"{statistics.median(r['cpu'] for r in news):.2f} | {cpu_ratio:.2f}x | {'yes' if same else 'NO'}",
                  flush=True)


if __name__ == "__main__":
    main()
