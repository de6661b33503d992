"""OPT-13B closing numbers of issue 18: capacity ratios paged : oracle : max on ShareGPT-like and Alpaca-like,
Fig. 13's mean batch, per CPU-time variant of an engine profile. Not a test; prints a table.

usage: python bench/fidelity_opt13b.py DURATION_S [PROFILE ...]   (default profiles vllm-2023:low|central|high)
"""

import sys
import time

import pandas as pd

from kvsim.planning.paper.experiments import FULL, SETUPS, SYSTEMS, capacities
from kvsim.planning.sweep.runner import run_sweep

duration = float(sys.argv[1]) if len(sys.argv) > 1 else 600.0
profiles = sys.argv[2:] or ["vllm-2023:low", "vllm-2023:central", "vllm-2023:high"]
names = ("vLLM (paged)", "Orca (Oracle)", "Orca (Max)")
for profile in profiles:
    t = time.perf_counter()
    frames = []
    for preset in ("sharegpt", "alpaca"):
        rates = list(FULL.rates[("OPT-13B", preset)])
        base = {**SETUPS["OPT-13B"], "preset": preset, "duration_s": duration, "seed": 0, "engine_profile": profile}
        for name in names:
            df = run_sweep({"rate": rates}, {**base, **SYSTEMS[name]}, workers=1)
            frames.append(df.assign(setup="OPT-13B", system=name))
    curves = pd.concat(frames, ignore_index=True)
    caps = capacities(curves).pivot_table(index="preset", columns="system", values="capacity_rps")
    print(f"== {profile}, {duration:.0f} s traces, {time.perf_counter() - t:.0f} s wall")
    for preset in ("sharegpt", "alpaca"):
        c = caps.loc[preset]
        p, o, m = c["vLLM (paged)"], c["Orca (Oracle)"], c["Orca (Max)"]
        print(f"{preset}: capacity paged {p:.2f} oracle {o:.2f} max {m:.2f} req/s; paged/oracle {p / o:.2f} paged/max {p / m:.2f}")
    for preset, rate in (("sharegpt", 2.0), ("alpaca", 30.0)):
        g = curves[(curves.preset == preset) & (curves.rate == rate)].set_index("system")
        print(f"{preset} @ {rate} req/s mean batch: " + ", ".join(
            f"{n} {g.loc[n, 'mean_batch_size']:.1f} (lat {g.loc[n, 'normalized_latency_s_per_token']:.3f} s/tok, "
            f"preempt {int(g.loc[n, 'preemptions'])})" for n in names))
    sys.stdout.flush()
