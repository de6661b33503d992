"""Covers: which P:D split serves the most requests within the SLO, kvsim against DistServe's simulator.

Scenario: the first N requests (default 300) of the Azure LLM inference 2023 conversation trace
(`../shared/traces/azure_llm_2023_conv.csv`) whose prompt + output fit OPT-13B's 2,048 tokens, OPT-13B
on A100-80GB GPUs with TP 1, G GPUs (default 4) split into P prefill and D decode instances (P + D = G),
SLO: TTFT <= 200 ms and TPOT <= 100 ms (DistServe's README example for OPT-13B), attainment target 90%.
For each split, goodput = the highest rate (the trace's arrivals rescaled, req/s) at which at least 90% of
requests meet both SLOs, searched the same way on both sides (`kvsim.fleet.disagg.slo.goodput`):
- kvsim: `kvsim.fleet` disaggregation, its own cost model (vllm-v1 profile, roofline), KV limit,
  transfers over `--kv-link` (default nvlink);
- DistServe: `DisaggCluster(N_prefill_instance=P, N_decode_instance=D)` driven by
  bench/distserve_disagg_driver.py in a separate process (its A100 profile fits, no KV transfer time,
  no KV memory limit); its own TTFT and TPOT (decoding latency / output tokens).
Colocated: G replicas of today's engine fed round-robin (kvsim) and DistServe's `VLLMCluster` with G
instances (its least-loaded dispatch).

Run: python bench/distserve_disagg.py [--n 300] [--gpus 4] [--start-rps 1] [--only 2:2,coloc] [--json out.json]
     python bench/distserve_disagg.py --n 19366 --at-rate 4 [--only 2:2]   (attainment at one rate only)
Prints one row per split and whether the two agree on the best split (and on the full order).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SHARED = Path(os.environ.get("KVSIM_SHARED", ROOT.parent / "shared"))
TRACE = SHARED / "traces" / "azure_llm_2023_conv.csv"
DISTSERVE = SHARED / "peers" / "distserve"
DRIVER = ROOT / "bench" / "distserve_disagg_driver.py"
TTFT_SLO_S, TPOT_SLO_S, TARGET = 0.2, 0.1, 0.9


def azure_requests(n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(arrival_s from 0, prompt, output) of the first `n` requests with prompt + output <= 2048."""
    from kvsim.trace.formats import load_trace

    t = load_trace(TRACE)
    keep = np.flatnonzero(t.prompt_tokens + t.output_tokens <= 2048)[:n]
    a = t.arrival_s[keep]
    return a - a[0], t.prompt_tokens[keep], t.output_tokens[keep]


class DistServe:
    """One driver process; `attainment(...)` sends it a job and scores the answer."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, str(DRIVER)], cwd=DISTSERVE, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**os.environ, "PYTHONPATH": str(DISTSERVE)})

    def latencies(self, job: dict) -> tuple[np.ndarray, np.ndarray]:
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        out = json.loads(self.proc.stdout.readline())
        return np.array(out["ttft_ms"]) / 1000, np.array(out["tpot_ms"]) / 1000

    def attainment(self, arrival, prompt, output, backend: str, prefill: int = 1, decode: int = 1,
                   replicas: int = 1) -> float:
        """Fraction of requests within both SLOs (DistServe's own TTFT and TPOT)."""
        ttft, tpot = self.latencies({"backend": backend, "prefill": prefill, "decode": decode,
                                     "replicas": replicas, "arrival_s": list(map(float, arrival)),
                                     "prompt": list(map(int, prompt)), "output": list(map(int, output))})
        return float(((ttft <= TTFT_SLO_S) & (tpot <= TPOT_SLO_S)).sum()) / len(arrival)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def kvsim_configs(link: str):
    from kvsim.planning.runs import make_config

    return make_config(model="opt-13b", gpu="a100-80gb", tp=1), link


def compare(n: int, gpus: int, link: str, rel_tol: float, peer: bool, requests=None,
            start_rps: float = 1.0, only: set[str] | None = None) -> dict:
    """Goodput per split (and colocated) on both simulators; `requests`: (arrival_s, prompt, output)
    arrays to use instead of the trace's first `n`; `start_rps`: where every search starts (the same
    on both sides; a start near the answer saves doubling runs); `only`: the configurations to run
    ('P:D' and/or 'coloc'; None: all), so that parts can run in parallel processes."""
    from kvsim.fleet.disagg.sim import DisaggConfig
    from kvsim.fleet.disagg.slo import attainment, colocated_columns, goodput, run_disagg
    from kvsim.fleet.disagg.kv_link import get_link
    from kvsim.trace.table import Trace, rescale_trace

    arrival, prompt, output = requests if requests is not None else azure_requests(n)
    base = Trace.from_arrays(arrival, prompt, output)
    cfg = kvsim_configs(link)[0]
    ds = DistServe() if peer else None

    spent = {"kvsim": [0, 0.0], "distserve": [0, 0.0]}   # runs, wall seconds per simulator

    def scaled(rate: float) -> Trace:
        return rescale_trace(base, rate_rps=rate)

    def timed(side: str, fn):
        def run(rate: float) -> float:
            start = time.perf_counter()
            try:
                return fn(rate)
            finally:
                spent[side][0] += 1
                spent[side][1] += time.perf_counter() - start
        return run

    rows = []
    try:
        for p in range(1, gpus):
            d = gpus - p
            if only is not None and f"{p}:{d}" not in only:
                continue
            split = DisaggConfig(cfg, cfg, p, d, get_link(link))
            ours, _ = goodput(timed("kvsim", lambda r: attainment(run_disagg(scaled(r), split).request_columns(),
                                                                 TTFT_SLO_S, TPOT_SLO_S)),
                              TARGET, rel_tol=rel_tol, start_rps=start_rps)
            theirs, tried = None, {}
            if ds is not None:
                theirs, tried = goodput(timed("distserve", lambda r: ds.attainment(
                    scaled(r).arrival_s, prompt, output, "distserve", p, d)), TARGET, rel_tol=rel_tol,
                    start_rps=start_rps)
            rows.append({"prefill": p, "decode": d, "kvsim_goodput_rps": ours, "distserve_goodput_rps": theirs,
                         "distserve_attainment": {str(r): a for r, a in sorted(tried.items())}})
        colo = colo_ds = None
        with_colo = only is None or "coloc" in only
        if with_colo:
            colo, _ = goodput(timed("kvsim", lambda r: attainment(colocated_columns(scaled(r), cfg, gpus),
                                                                 TTFT_SLO_S, TPOT_SLO_S)),
                              TARGET, rel_tol=rel_tol, start_rps=start_rps)
        if ds is not None and with_colo:
            colo_att = timed("distserve", lambda r: ds.attainment(scaled(r).arrival_s, prompt, output, "vllm",
                                                                  replicas=gpus))

            # The idle-system check: when even the search's lowest rate (start / 1024, requests far
            # apart) misses the target, the search would halve down to it and answer 0.0; say so at once.
            idle = colo_att(start_rps / 1024)
            colo_ds = 0.0 if idle < TARGET else goodput(colo_att, TARGET, rel_tol=rel_tol, start_rps=start_rps)[0]
    finally:
        if ds is not None:
            ds.close()
    return {"requests": [[float(a), int(p), int(o)] for a, p, o in zip(arrival, prompt, output)],
            "n": n, "gpus": gpus, "kv_link": link, "ttft_slo_s": TTFT_SLO_S, "tpot_slo_s": TPOT_SLO_S,
            "target": TARGET, "rel_tol": rel_tol, "splits": rows,
            "colocated": {"kvsim_goodput_rps": colo, "distserve_goodput_rps": colo_ds},
            "runs": {side: {"runs": k, "wall_s": round(w, 1)} for side, (k, w) in spent.items()}}


def attainment_at(n: int, gpus: int, link: str, rate: float, only: set[str] | None) -> list[dict]:
    """SLO attainment of each configuration at one rate (req/s) on both simulators, with the CPU seconds
    of each run: for traces too long for a goodput search (the whole Azure trace)."""
    import resource

    from kvsim.fleet.disagg.sim import DisaggConfig
    from kvsim.fleet.disagg.slo import attainment, colocated_columns, run_disagg
    from kvsim.fleet.disagg.kv_link import get_link
    from kvsim.trace.table import Trace, rescale_trace

    arrival, prompt, output = azure_requests(n)
    trace = rescale_trace(Trace.from_arrays(arrival, prompt, output), rate_rps=rate)
    cfg, rows = kvsim_configs(link)[0], []
    names = [f"{p}:{gpus - p}" for p in range(1, gpus)] + ["coloc"]
    for name in [x for x in names if only is None or x in only]:
        start = time.process_time()
        if name == "coloc":
            cols = colocated_columns(trace, cfg, gpus)
        else:
            p = int(name.split(":")[0])
            cols = run_disagg(trace, DisaggConfig(cfg, cfg, p, gpus - p, get_link(link))).request_columns()
        ours, ours_s = attainment(cols, TTFT_SLO_S, TPOT_SLO_S), time.process_time() - start
        ds, before = DistServe(), resource.getrusage(resource.RUSAGE_CHILDREN)
        if name == "coloc":
            theirs = ds.attainment(trace.arrival_s, prompt, output, "vllm", replicas=gpus)
        else:
            theirs = ds.attainment(trace.arrival_s, prompt, output, "distserve", p, gpus - p)
        ds.close()
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        rows.append({"config": name, "rate_rps": rate, "kvsim_attainment": ours, "kvsim_cpu_s": round(ours_s, 1),
                     "distserve_attainment": theirs, "distserve_cpu_s": round(
                         after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 1)})
        print(f"{name:>5} at {rate:g} req/s: kvsim {ours:.3f} ({ours_s:.0f} s CPU), DistServe {theirs:.3f} "
              f"({rows[-1]['distserve_cpu_s']:.0f} s CPU, one process)", flush=True)
    return rows


def order(rows: list[dict], key: str) -> list[str]:
    """Splits from most to least goodput ('P:D')."""
    return [f"{r['prefill']}:{r['decode']}" for r in sorted(rows, key=lambda r: -r[key])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=300, help="requests from the start of the trace")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs to split into prefill and decode instances")
    ap.add_argument("--kv-link", default="nvlink")
    ap.add_argument("--rel-tol", type=float, default=0.05)
    ap.add_argument("--start-rps", type=float, default=1.0, help="rate every goodput search starts from")
    ap.add_argument("--only", help="comma-separated configurations to run (e.g. 1:3,coloc); default all")
    ap.add_argument("--at-rate", type=float, help="no goodput search: attainment of each configuration at "
                    "this rate (req/s) on both simulators, with CPU seconds per run")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()
    if not TRACE.exists():         # nothing to compare: say so and fail, so a script running it notices
        sys.exit(f"skipped: {TRACE} is not here (put the project's shared/ folder beside the repository, "
                 "or set KVSIM_SHARED to it)")
    peer = DISTSERVE.exists()
    if not peer:
        print(f"DistServe skipped: {DISTSERVE} is not here")
    only = set(args.only.split(",")) if args.only else None
    if args.at_rate is not None:
        rows = attainment_at(args.n, args.gpus, args.kv_link, args.at_rate, only)
        if args.json:
            args.json.write_text(json.dumps(rows) + "\n")
        return
    start = time.perf_counter()
    res = compare(args.n, args.gpus, args.kv_link, args.rel_tol, peer, start_rps=args.start_rps,
                  only=only)
    print(f"{args.n} Azure conversation requests, OPT-13B, {args.gpus} x A100-80GB (TP 1), "
          f"SLO TTFT {TTFT_SLO_S * 1000:.0f} ms / TPOT {TPOT_SLO_S * 1000:.0f} ms at {TARGET:.0%}")
    print(f"{'P:D':>5} {'kvsim goodput':>14} {'DistServe goodput':>18}   (req/s)")
    for r in res["splits"]:
        ds = "-" if r["distserve_goodput_rps"] is None else f"{r['distserve_goodput_rps']:.2f}"
        print(f"{r['prefill']}:{r['decode']:<3} {r['kvsim_goodput_rps']:>14.2f} {ds:>18}")
    c = res["colocated"]
    cds = "-" if c["distserve_goodput_rps"] is None else f"{c['distserve_goodput_rps']:.2f}"
    if c["kvsim_goodput_rps"] is not None:
        print(f"{'coloc':>5} {c['kvsim_goodput_rps']:>14.2f} {cds:>18}   ({args.gpus} colocated replicas)")
    ours = order(res["splits"], "kvsim_goodput_rps")
    print(f"kvsim order:     {' > '.join(ours)}")
    if peer and res["splits"]:
        theirs = order(res["splits"], "distserve_goodput_rps")
        print(f"DistServe order: {' > '.join(theirs)}")
        print(f"best split agrees: {ours[0] == theirs[0]}; full order agrees: {ours == theirs}")
    runs = "; ".join(f"{side}: {v['runs']} runs, {v['wall_s']:.0f} s" for side, v in res["runs"].items())
    print(f"({time.perf_counter() - start:.0f} s; {runs})")
    if args.json:
        args.json.write_text(json.dumps(res) + "\n")


if __name__ == "__main__":
    main()
