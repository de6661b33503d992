"""The fleet's command-line options (`kvsim run --replicas N --router ...`, `kvsim capacity --router`)
and its table: requests routed, the router's decisions, imbalance and each replica's key figures."""

from __future__ import annotations

import typer

ReplicasOpt = typer.Option(1, "--replicas", help="Engines behind the router, each the whole deployment "
                           "(its --tp GPUs, KV cache, scheduler and prefix cache); 1: one engine.")
RouterOpt = typer.Option("round-robin", "--router", help="How requests are spread over the replicas: "
                         "round-robin, least-requests, least-kv or prefix-aware (docs/fleet.md).")
BalanceAbsOpt = typer.Option(64, "--router-balance-abs", help="prefix-aware: the fleet is out of balance "
                             "when the busiest replica has more than this many outstanding requests above the "
                             "idlest (and --router-balance-rel times as many); then the idlest takes the request "
                             "(SGLang's balance_abs_threshold).")
BalanceRelOpt = typer.Option(1.5, "--router-balance-rel", help="prefix-aware: the ratio part of that test "
                             "(SGLang's balance_rel_threshold).")
CacheThresholdOpt = typer.Option(0.3, "--router-cache-threshold", help="prefix-aware: the share of a "
                                 "prompt's shareable blocks a replica must hold to win it on its prefix "
                                 "(SGLang's cache_threshold).")
CpuKvOpt = typer.Option(0.0, "--cpu-kv-gib", help="CPU memory per replica keeping KV blocks the GPU prefix "
                        "cache evicts (LRU); a later hit loads them over PCIe (vLLM's --kv-offloading-size; "
                        "needs --prefix-caching).")

CpuKvPolicyOpt = typer.Option("evicted", "--cpu-kv-policy", help="What the CPU tier stores: evicted (blocks "
                              "the GPU prefix cache evicts) or store-all (every computed block, as vLLM's "
                              "OffloadingConnector with --kv-offloading-size does).")


def fleet_config(replicas, router, balance_abs, balance_rel, cache_threshold):
    """The `FleetConfig` of the flags (ValueError naming the flag when one is wrong)."""
    from kvsim.fleet.config import FleetConfig
    return FleetConfig(replicas, router, balance_abs, balance_rel, cache_threshold)


def steps_files(out, fleet):
    """Where `kvsim run --out` streams the steps: `steps.csv` (`StepsCsv`) for one engine, each
    replica's `replicas/<r>/steps.csv` (`ReplicaSteps`) for a fleet; None without --out."""
    from kvsim.cli.run_files import ReplicaSteps, StepsCsv
    if out is None:
        return None
    return StepsCsv(out / "steps.csv", folder=out) if fleet.replicas == 1 else ReplicaSteps(out, fleet.replicas)


def run_one(trace, cfg, fleet, progress, steps_csv):
    """`kvsim run`'s simulation: one engine (`kvsim.engine.sim.simulate`, its steps streamed to
    `steps_csv`), or for more than one replica the fleet (`kvsim.fleet.sim.simulate_fleet`, each
    replica's steps to `steps_csv.sinks`). vLLM's --data-parallel-size N without --replicas runs N
    engines behind its least-loaded balancer (`dp_fleet`)."""
    fleet, dp = dp_fleet(cfg, fleet)
    if dp:
        steps_csv = None            # (--out: the engines' steps are not streamed)
    if fleet.replicas == 1:
        from kvsim.engine.sim import simulate
        return simulate(trace, cfg, progress, keep_steps=False, step_sink=steps_csv)
    from kvsim.fleet.sim import simulate_fleet
    return simulate_fleet(trace, cfg, fleet, progress, step_sinks=steps_csv.sinks if steps_csv else None)


def dp_fleet(cfg, fleet):
    """(fleet, whether it was made from --data-parallel-size): `cfg.deployment.dp` engines behind the
    least-requests router (vLLM's DP coordinator sends each request to the engine with the fewest
    waiting x 4 + running requests: vllm/v1/engine/core_client.py), unless --replicas says otherwise."""
    dp = cfg.deployment.dp
    if dp == 1 or fleet.replicas != 1:
        return fleet, False
    from dataclasses import replace
    return replace(fleet, replicas=dp, router="least-requests"), True


def print_fleet(summary: dict) -> None:
    """The fleet section of a run's summary: one row per replica, then routing and imbalance."""
    from rich.table import Table

    from kvsim.cli.output import console

    fleet = summary.get("fleet")
    if fleet is None:
        return
    table = Table(title=f"{fleet['replicas']} replicas, {fleet['router']} router ({fleet['gpus']} GPUs)")
    for name in ("replica", "requests", "finished", "TTFT p99 (s)", "prefix hits", "KV used", "preemptions"):
        table.add_column(name, justify="right")
    for r, s in enumerate(fleet["per_replica"]):
        p99 = s["ttft_s"]["p99"]
        used = 1.0 - s["kv"]["mean_fraction"]["free"]
        table.add_row(str(r), f"{s['requests_total']:,}", f"{s['requests_finished']:,}",
                      "-" if p99 is None else f"{p99:.3g}", f"{s['prefix_cache_hit_rate']:.1%}",
                      f"{used:.1%}", f"{s['preemptions']:,}")
    console.print(table)
    imb = fleet["imbalance"]
    decisions = ", ".join(f"{k} {v:,}" for k, v in fleet["decisions"].items()) or "-"
    console.print(f"imbalance (max / mean): requests {imb['requests_max_over_mean']:.2f}, KV used "
                  f"{imb['kv_used_max_over_mean']:.2f}; router decisions: {decisions}", highlight=False)


def print_fleet_gpus(console, df, rate: float) -> None:
    """`kvsim capacity --gpus-for RATE --router R`: the fewest replicas per TP degree, fleets simulated."""
    from rich.table import Table

    t = Table(title=f"GPUs for {rate:g} req/s, fleets simulated behind the {df.router.iloc[0]} router")
    metrics = [c for c in df.columns if c.startswith(("ttft_", "tpot_", "e2e_", "normalized_"))]
    for col in ("TP", "fits", "replicas", "GPUs", *metrics, "prefix hits", "runs", "judged on s", "note"):
        t.add_column(col, justify="right")
    num = (lambda v, f: "-" if v is None or v != v else f.format(v))
    for r in df.to_dict("records"):
        t.add_row(str(r["tp"]), {True: "yes", False: "no"}.get(r["fits"], "-"), num(r["replicas"], "{:.0f}"),
                  num(r["gpus"], "{:.0f}"), *(num(r[m], "{:.3g}") for m in metrics),
                  num(r.get("prefix_cache_hit_rate"), "{:.1%}"), str(r["runs"]),
                  num(r.get("span_s"), "{:.0f}"), r["note"][:60])
    console.print(t)
    best = df[df.best].iloc[0]
    console.print(f"fewest GPUs: {best.gpus:.0f} = {best.replicas:.0f} replicas x TP {best.tp}", highlight=False)
    if best.note:                          # kvsim/planning/rate/fleet_steady.py: an uncertain verdict
        console.print(f"note: {best.note}", highlight=False, soft_wrap=True)
