"""Covers: the simulator's wall time on a hybrid model (sliding-window / chunked-local layers served by
vLLM's hybrid KV cache manager) against a full-attention model on the same trace, side by side in one run.

Scenario: the one-hour ShareGPT-like preset at 2 req/s (seed 0), default `kvsim run` flags (engine
profile `vllm-v1`, paged: vLLM's hybrid KV cache manager for the hybrid models), each model on an
H100-80GB at a TP degree that holds its weights and a maximum length: Llama-3-8B (the reference, its own
8,192), and the hybrid models named by --models (MODEL:TP:MAX_MODEL_LEN). Each run is a fresh process; runs alternate
reference, hybrid, reference, hybrid, ... and the table gives each model's median `sim_wall_s` and its
ratio to the reference's.

Run: .venv/bin/python bench/hybrid_models_speed.py [--models gpt-oss-120b:1:32768,gemma-3-27b:1:32768]
     [--repeats 3] [--duration 3600]
Target (issue 23): a hybrid model's run takes at most 2x the reference's wall time.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

ONE = r"""
import json, sys
import kvsim
model, tp, max_len, duration = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
trace = kvsim.generate_trace("sharegpt", rate_rps=2.0, duration_s=duration, seed=0)
r = kvsim.simulate(trace, model=model, gpu="h100-80gb", tp=tp, max_model_len=max_len or None)
s = r.summary
print(json.dumps({"wall": s["sim_wall_s"], "steps": s["engine_steps"], "finished": s["requests_finished"],
                  "batch": s["mean_batch_size"]}))
"""


def run_one(model: str, tp: int, max_len: int, duration: float) -> dict:
    out = subprocess.run([sys.executable, "-c", ONE, model, str(tp), str(max_len), str(duration)], check=True,
                         text=True, stdout=subprocess.PIPE)
    return json.loads(out.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reference", default="llama-3-8b:1:0", help="MODEL:TP:MAX_LEN (0: the model's) of the "
                    "full-attention reference")
    ap.add_argument("--models", default="gpt-oss-120b:1:32768,gemma-3-27b:1:32768", help="MODEL:TP:MAX_LEN,... "
                    "to compare")
    ap.add_argument("--repeats", type=int, default=3, help="paired runs per model (median reported)")
    ap.add_argument("--duration", type=float, default=3600.0, help="trace length, seconds")
    args = ap.parse_args()
    ref_name, ref_tp, ref_len = args.reference.split(":")
    print(f"reference {args.reference}; {args.repeats} paired runs, median sim_wall_s")
    print("model | tp | steps | finished | mean batch | wall s | reference wall s | ratio")
    for item in args.models.split(","):
        name, tp, max_len = item.split(":")
        refs, hybs = [], []
        for _ in range(args.repeats):
            refs.append(run_one(ref_name, int(ref_tp), int(ref_len), args.duration))
            hybs.append(run_one(name, int(tp), int(max_len), args.duration))
        ref_wall = statistics.median(r["wall"] for r in refs)
        wall = statistics.median(r["wall"] for r in hybs)
        h = hybs[0]
        print(f"{name} | {tp} | {h['steps']:,} | {h['finished']:,} | {h['batch']:.1f} | {wall:.2f} | "
              f"{ref_wall:.2f} | {wall / ref_wall:.2f}x", flush=True)


if __name__ == "__main__":
    main()
