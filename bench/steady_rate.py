"""Covers: issue 41's target for the rate search: the highest rate under an SLO moves less than 5 %
between `--duration 120`, the default (600 s) and 3,600 s, or the search says its answer is a bound.

Scenario: `kvsim.max_rate` (what `kvsim capacity --slo` runs) for each case below at the three
durations, one worker, in this process (its run cache is cleared between searches so each pays its
own runs). Prints one Markdown table: the answer per duration, the trace span its answer was judged
steady on, the largest move against the 3,600 s answer, the note (a bound, and why) and wall seconds.

Run: python bench/steady_rate.py [--cases NAME,...] [--durations 120,600,3600]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

#: name -> (SLO, preset, flags): several models, GPUs and presets (the README's examples first).
CASES = {
    "llama-3-8b/h100/sharegpt": ({"ttft_p99": 2}, "sharegpt", {"model": "llama-3-8b", "gpu": "h100-80gb"}),
    "llama-2-70b-tp4/a100-80gb/sharegpt": ({"ttft_p99": 2}, "sharegpt",
                                           {"model": "llama-2-70b", "gpu": "a100-80gb", "tp": 4}),
    "opt-13b/a100-40gb-12gib/sharegpt": ({"ttft_p99": 2}, "sharegpt", {"model": "opt-13b", "kv_gib": 12}),
    "opt-13b/a100-40gb-12gib/alpaca": ({"ttft_p99": 1}, "alpaca", {"model": "opt-13b", "kv_gib": 12}),
    "llama-2-7b/a100-80gb/sharegpt-norm": ({"normalized_latency": 0.1}, "sharegpt",
                                           {"model": "llama-2-7b", "gpu": "a100-80gb"}),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", default=",".join(CASES), help="comma-separated case names")
    ap.add_argument("--durations", default="120,600,3600", help="comma-separated --duration values (s)")
    args = ap.parse_args()
    from kvsim.planning.rate import runs as rate_runs
    from kvsim.planning.rate.search import max_rate

    durations = [float(d) for d in args.durations.split(",")]
    print("| case | " + " | ".join(f"{d:g} s: req/s (judged on)" for d in durations) +
          " | largest move | note | wall (s) |")
    print("|---" * (len(durations) + 4) + "|")
    for name in args.cases.split(","):
        slo, preset, flags = CASES[name]
        answers, notes, wall = [], set(), 0.0
        for d in durations:
            rate_runs._CACHE.clear()
            start = time.perf_counter()
            res = max_rate(slo, preset=preset, duration_s=d, workers=1, **flags)
            wall += time.perf_counter() - start
            answers.append((res.rate_rps, res.span_s))
            if res.note:                        # "uncertain: ..." -> "uncertain at 120 s"
                notes.add(f"{res.note.split(':')[0]} at {d:g} s")
        ref = answers[-1][0]
        move = max(abs(a - ref) / ref for a, _ in answers)
        cells = [f"{a:.3g} ({s:g} s)" if s else f"{a:.3g}" for a, s in answers]
        print(f"| {name} | " + " | ".join(cells) + f" | {move:.1%} | {'; '.join(sorted(notes)) or '-'} | "
              f"{wall:.0f} |", flush=True)


if __name__ == "__main__":
    main()
