"""The vLLM paper's experiments (Kwon et al., SOSP'23, sections 6.2 and 7) replayed in kvsim.

Setups of the paper's Table 1: OPT-13B on 1 x A100-40GB (12 GiB of KV), OPT-66B on 4 x A100-40GB
(21 GiB), OPT-175B on 8 x A100-80GB (264 GiB); ShareGPT-like and Alpaca-like Poisson traces. Runs:
normalized latency against request rate for static batching, contiguous max/pow2/oracle and paged; the
memory breakdown and mean batched requests per system at one rate; a block-size sweep; recompute against
swap over block sizes; for OPT-13B the same capacity, batch, block-size and swap studies again under the
low and high CPU-time variants of the main profile (`variants`). Every run is a sweep point, and all
of them run as one pool (kvsim/planning/paper/runs.py: each distinct run once, a curve's points in
order of rate so that only the point past a knee runs to its end).
Traces last one hour as in the paper unless `duration_s` says otherwise (shorter traces soften the
latency explosion past capacity but keep the knee).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from kvsim.planning.paper.runs import STOP, KneeRule, Runs
from kvsim.planning.runs import SYSTEMS as RUN_SYSTEMS, run_flags

#: The paper's deployments (Table 1) as run flags.
SETUPS: dict[str, dict] = {
    "OPT-13B": {"model": "opt-13b", "gpu": "a100-40gb", "tp": 1, "kv_gib": 12},
    "OPT-66B": {"model": "opt-66b", "gpu": "a100-40gb", "tp": 4, "kv_gib": 21},
    "OPT-175B": {"model": "opt-175b", "gpu": "a100-80gb", "tp": 8, "kv_gib": 264},
}
#: The systems compared, with the paper's names, as run flags.
SYSTEMS: dict[str, dict] = {paper: RUN_SYSTEMS[name] for paper, name in (
    ("vLLM (paged)", "paged"), ("Orca (Oracle)", "contiguous-oracle"), ("Orca (Pow2)", "contiguous-pow2"),
    ("Orca (Max)", "contiguous-max"), ("FasterTransformer (static)", "static"))}
#: A system's capacity: the rate (interpolated) where its normalized latency first exceeds KNEE_FACTOR
#: times the lowest normalized latency any system reaches at the lowest rate of the grid.
KNEE_FACTOR = 2.0
#: The latency plots' ceiling (s/token; the vLLM paper's Fig. 12 stops its y axis at 1 s/token): a curve
#: point past a system's knee stops once its normalized latency is surely above it (`latency_ceiling`),
#: unless its value is needed (a table rate's row, or the first point past the knee: the capacity
#: interpolates to it). `ceiling=False` in `run_paper` runs every point to its end.
CEILING_S_PER_TOKEN = 1.0


@dataclass(frozen=True)
class PaperPlan:
    """What to run: rates (req/s) per (setup, preset), trace length (s), the rate for the breakdown and
    batch tables per (setup, preset), block sizes (tokens) and the rates of the block-size studies."""

    setups: tuple[str, ...]
    rates: dict = field(default_factory=dict)           # (setup, preset) -> rates
    table_rate: dict = field(default_factory=dict)      # (setup, preset) -> rate in `rates`
    duration_s: float = 3600.0
    block_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    block_rate: dict = field(default_factory=dict)      # preset -> rate for OPT-13B block-size sweep
    swap_rate: float = 3.0                              # ShareGPT rate of the recompute/swap study
    seed: int = 0
    variants: tuple[str, ...] = ("low", "high")         # CPU-time variants run again for OPT-13B


FULL = PaperPlan(
    setups=("OPT-13B", "OPT-66B", "OPT-175B"),
    rates={("OPT-13B", "sharegpt"): (0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 4.0),
           ("OPT-13B", "alpaca"): (1, 2.5, 5, 10, 20, 30, 35, 40, 50),
           ("OPT-66B", "sharegpt"): (0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5),
           ("OPT-66B", "alpaca"): (0.5, 1, 2.5, 5, 10, 15, 20, 25),
           ("OPT-175B", "sharegpt"): (0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 3.0, 3.5, 4.0),
           ("OPT-175B", "alpaca"): (1, 2.5, 5, 10, 20, 25, 30, 40)},
    table_rate={("OPT-13B", "sharegpt"): 2.0, ("OPT-13B", "alpaca"): 30,
                ("OPT-66B", "sharegpt"): 1.0, ("OPT-66B", "alpaca"): 15,
                ("OPT-175B", "sharegpt"): 2.0, ("OPT-175B", "alpaca"): 20},
    block_rate={"sharegpt": 2.0, "alpaca": 30},
)
QUICK = PaperPlan(
    setups=("OPT-13B",),
    rates={("OPT-13B", "sharegpt"): (1.0, 3.0), ("OPT-13B", "alpaca"): (10, 40)},
    table_rate={("OPT-13B", "sharegpt"): 3.0, ("OPT-13B", "alpaca"): 40},
    duration_s=30.0, block_sizes=(4, 16, 128), block_rate={"sharegpt": 3.0, "alpaca": 40}, swap_rate=4.0,
    variants=(),
)
#: The systems the variant runs compare (the ratios the paper states).
VARIANT_SYSTEMS = ("vLLM (paged)", "Orca (Oracle)", "Orca (Max)")


def engine_profiles() -> tuple[str | None, str | None]:
    """(main profile, the one shown beside it): ('vllm-2023', 'vllm-v1') where kvsim has engine profiles,
    else (None, None)."""
    return ("vllm-2023", "vllm-v1") if "engine_profile" in run_flags() else (None, None)


def capacity(curve: pd.DataFrame, threshold: float) -> float:
    """Rate (req/s) where normalized latency crosses `threshold`, linear between grid points; the
    highest rate when it never does, 0.0 when even the lowest rate is above it."""
    c = curve.sort_values("rate")
    rates, lat = c.rate.to_numpy(float), c.normalized_latency_s_per_token.to_numpy(float)
    if lat[0] > threshold:
        return 0.0
    for k in range(1, len(rates)):
        if lat[k] > threshold:
            w = (threshold - lat[k - 1]) / (lat[k] - lat[k - 1])
            return float(rates[k - 1] + w * (rates[k] - rates[k - 1]))
    return float(rates[-1])


@dataclass
class PaperResults:
    """Every whole run's row (`curves`, `blocks`, `swap`), the capacities and the wall time (s); `variants`:
    per CPU-time variant name (e.g. 'vllm-2023:low'), OPT-13B's (curves, blocks, swap) under it; `above`:
    the curve points stopped once surely above the ceiling (setup, system, profile, preset, rate, and
    `latency_above_s_per_token`), left out of the curves: no capacity needs them (`paper_runs.knees`)."""

    plan: PaperPlan
    profile: str | None
    side_profile: str | None
    curves: pd.DataFrame
    blocks: pd.DataFrame
    swap: pd.DataFrame
    capacities: pd.DataFrame
    wall_s: float
    variants: dict = field(default_factory=dict)
    above: pd.DataFrame = field(default_factory=pd.DataFrame)    # curve points stopped above the ceiling


def _block_and_swap(plan: PaperPlan, extra: dict, runs: Runs) -> tuple[list[tuple[int, str]], int]:
    """Queue OPT-13B's block-size sweep per preset and its recompute-against-swap sweep under `extra`
    flags: ((index, preset) per block-size sweep, the swap sweep's index)."""
    base13 = {**SETUPS["OPT-13B"], "duration_s": plan.duration_s, "seed": plan.seed, **extra,
              "allocator": "paged"}
    blocks = [(runs.add({"block_size": list(plan.block_sizes)}, {**base13, "preset": p, "rate": r}), p)
              for p, r in plan.block_rate.items()]
    swap = runs.add({"preemption": ["recompute", "swap"], "block_size": list(plan.block_sizes)},
                    {**base13, "preset": "sharegpt", "rate": plan.swap_rate})
    return blocks, swap


def _blocks_frame(runs: Runs, queued: tuple[list[tuple[int, str]], int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    return (pd.concat([runs.frame(i, {"preset": p}) for i, p in queued[0]], ignore_index=True), runs.frame(queued[1]))


def run_paper(plan: PaperPlan = FULL, workers: int | None = None, ceiling: bool = True) -> PaperResults:
    """Run every experiment of `plan` (all its runs as one pool of `workers` processes; None: all
    cores). With `ceiling`, curve points past a knee stop once surely above CEILING_S_PER_TOKEN."""
    start = time.perf_counter()
    profile, side = engine_profiles()
    extra = {"engine_profile": profile} if profile else {}
    runs = Runs()
    curves_at: list[tuple[int, dict]] = []
    for setup in plan.setups:
        for preset in ("sharegpt", "alpaca"):
            rates = list(plan.rates[(setup, preset)])
            base = {**SETUPS[setup], "preset": preset, "duration_s": plan.duration_s, "seed": plan.seed,
                    **extra}
            for name, flags in SYSTEMS.items():
                curves_at.append((runs.add({"rate": rates}, {**base, **flags}),
                                  dict(setup=setup, system=name, profile=profile or "default")))
            if side:
                curves_at.append((runs.add({"rate": rates}, {**base, **SYSTEMS["vLLM (paged)"],
                                                             "engine_profile": side}),
                                  dict(setup=setup, system=f"vLLM (paged, {side})", profile=side)))
    main_blocks = _block_and_swap(plan, extra, runs)
    variants_at = {}
    for v in (plan.variants if profile and "OPT-13B" in plan.setups else ()):
        name = f"{profile}:{v}"
        vcurves = []
        for preset in ("sharegpt", "alpaca"):
            base = {**SETUPS["OPT-13B"], "preset": preset, "duration_s": plan.duration_s, "seed": plan.seed,
                    "engine_profile": name}
            for system in VARIANT_SYSTEMS:
                vcurves.append((runs.add({"rate": list(plan.rates[("OPT-13B", preset)])},
                                         {**base, **SYSTEMS[system]}),
                                dict(setup="OPT-13B", system=system, profile=name)))
        variants_at[name] = (vcurves, _block_and_swap(plan, {"engine_profile": name}, runs))
    if ceiling:
        for i, tags in curves_at + [c for vc, _ in variants_at.values() for c in vc]:
            setup = tags["setup"]
            for p in runs.sweeps[i]:
                if p["rate"] != plan.table_rate.get((setup, p["preset"])):
                    p[STOP] = float(CEILING_S_PER_TOKEN)
    runs.run(workers, [curves_at] + [vc for vc, _ in variants_at.values()],
             KneeRule(KNEE_FACTOR, CEILING_S_PER_TOKEN, VARIANT_SYSTEMS) if ceiling else None)
    above: list[dict] = []
    curves = pd.concat([runs.frame(i, tags, above) for i, tags in curves_at], ignore_index=True)
    blocks, swap = _blocks_frame(runs, main_blocks)
    variants = {name: (pd.concat([runs.frame(i, tags, above) for i, tags in vc], ignore_index=True),
                       *_blocks_frame(runs, vb)) for name, (vc, vb) in variants_at.items()}
    return PaperResults(plan, profile, side, curves, blocks, swap, capacities(curves),
                        time.perf_counter() - start, variants, pd.DataFrame(above))


def capacities(curves: pd.DataFrame) -> pd.DataFrame:
    """One row per (setup, preset, system): capacity (req/s) at KNEE_FACTOR and its ratio to Orca (Max)."""
    rows = []
    for (setup, preset), g in curves.groupby(["setup", "preset"], sort=False):
        low = g[g.rate == g.rate.min()].normalized_latency_s_per_token.min()
        threshold = KNEE_FACTOR * low
        caps = {name: capacity(c, threshold) for name, c in g.groupby("system", sort=False)}
        ref = caps.get("Orca (Max)") or float("nan")
        for name, cap in caps.items():
            rows.append({"setup": setup, "preset": preset, "system": name, "capacity_rps": cap,
                         "threshold_s_per_token": threshold,
                         "ratio_to_max": cap / ref if ref == ref and ref > 0 else float("nan")})
    return pd.DataFrame(rows)
