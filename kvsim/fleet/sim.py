"""One fleet simulation: `replicas` engines, each built from the run's configuration as the single
engine is (`kvsim.engine.build.build_run`), and a router process in one SimPy environment.

The router process hands each arrival to the replica its policy picks (kvsim/fleet/router.py) at the
time and in the order the single engine's own arrivals would be queued (`kvsim.engine.loop`): with one
replica the run is the single engine's, step for step (tests/fleet/test_fleet.py).
"""

from __future__ import annotations

import gc
import time
from typing import Callable

import numpy as np
import simpy

from kvsim.engine.build import build_run
from kvsim.engine.config import SimConfig
from kvsim.engine.metrics import StepLog
from kvsim.fleet.config import FleetConfig
from kvsim.fleet.replica import Replica
from kvsim.fleet.router import Router
from kvsim.fleet.summary import fleet_summary, imbalance, merged_columns, replica_summary
from kvsim.trace.table import Trace


class FleetResult:
    """`summary`: the fleet's (DESIGN.md keys) with a `fleet` section (replicas, router, requests
    routed to each, the router's decisions, imbalance, each replica's own summary); `request_columns`:
    per-request numpy columns over the whole trace, `replica` included; `routing`: one row per request
    in routing order (`Router.routing_columns`, with the request's `id` and `arrival_s`)."""

    def __init__(self, summary: dict, request_columns: dict[str, np.ndarray], routing: dict | None = None):
        self.summary, self.request_columns, self.routing = summary, request_columns, routing or {}

    @property
    def requests(self):
        """The per-request columns as a pandas table."""
        import pandas as pd
        return pd.DataFrame(self.request_columns)

    @property
    def replica_summaries(self) -> list[dict]:
        return self.summary["fleet"]["per_replica"]


def simulate_fleet(trace: Trace, cfg: SimConfig, fleet: FleetConfig, progress: Callable[[float], None] | None = None,
                   cost=None, fast_forward: bool = True, step_sinks=None) -> FleetResult:
    """Run `trace` through `fleet.replicas` copies of the configured deployment behind `fleet.router`;
    deterministic. `cost` replaces every replica's cost model (tests pass a `ConstantCost`);
    `step_sinks[r]` receives replica r's step rows as they are folded (`StepLog`'s sink, e.g. a CSV writer).

    >>> import kvsim
    >>> tr = kvsim.generate_trace("alpaca", rate_rps=8, num_requests=40, seed=0)
    >>> r = kvsim.simulate_fleet(tr, kvsim.make_config(model="llama-3-8b", gpu="h100-80gb"),
    ...                          kvsim.FleetConfig(2, "least-requests"))
    >>> sum(r.summary["fleet"]["routed"])
    40
    """
    env = simpy.Environment()
    replicas: list[Replica] = []
    times = trace.arrival_s.tolist()
    router_box: list[Router] = []
    env.process(_arrivals(env, times, router_box, replicas, progress))   # (before the engines, as in loop.py)
    parts = None
    for r in range(fleet.replicas):
        parts = build_run(trace, cfg)
        profile = parts.profile
        cpu = profile.cpu_seconds if profile.cpu_step_s or profile.cpu_seq_s else None
        log = StepLog(keep=False, sink=step_sinks[r] if step_sinks is not None else None)
        replicas.append(Replica(env, parts.scheduler, cost or parts.cost, log, cpu, fast_forward))
    block_ids = parts.scheduler.block_ids or (lambda i: [])
    router_box.append(Router(fleet, replicas, block_ids, parts.capacity_tokens // parts.block_size))
    start = time.perf_counter()
    collecting = gc.isenabled()
    gc.disable()
    try:
        env.run()
    finally:
        if collecting:
            gc.enable()
    wall = time.perf_counter() - start
    base = {"id": np.array([trace.request_id(i) for i in range(len(trace))], dtype=object),
            "arrival_s": np.asarray(trace.arrival_s)}
    kv_bytes = cfg.deployment.kv_bytes_per_token()
    capacity, block_size = parts.capacity_tokens, parts.block_size
    own = [rep.sched.request_columns() for rep in replicas]
    per_replica = [replica_summary(base, rep, cols, capacity, block_size, wall, kv_bytes, cfg)
                   for rep, cols in zip(replicas, own)]
    columns = merged_columns(base, replicas, own)
    summary = fleet_summary(columns, replicas, capacity, block_size, wall, kv_bytes, cfg)
    router = router_box[0]
    summary["fleet"] = {"replicas": fleet.replicas, "router": fleet.router,
                        "gpus": fleet.replicas * cfg.deployment.tp,
                        "capacity_tokens": capacity * fleet.replicas,
                        "routed": list(router.routed), "decisions": dict(sorted(router.decisions.items())),
                        "imbalance": imbalance(per_replica), "per_replica": per_replica}
    routing = router.routing_columns()
    order = np.asarray(routing["request"], np.int64)
    routing = {"id": base["id"][order], "arrival_s": base["arrival_s"][order], **routing}
    return FleetResult(summary, columns, routing)


def _arrivals(env: simpy.Environment, times: list[float], router_box: list[Router], replicas: list[Replica],
              progress):
    """The router process: at each arrival time (reached as `kvsim.engine.loop._Arrivals` reaches it),
    dispatch every request that has arrived to the replica the router picks; then close the replicas."""
    router, num, i, report = router_box[0], len(times), 0, 1000
    while i < num:
        now = env.now
        while i < num and times[i] <= now:
            replicas[router.route(i)].dispatch(i, now)
            i += 1
        if progress is not None and i >= report:
            progress(now)
            report = i + 1000
        if i < num:
            yield env.timeout(times[i] - now)
    for rep in replicas:
        rep.close()


def run_summary(trace: Trace, cfg: SimConfig, fleet: FleetConfig | None) -> dict:
    """One run's summary for a table row (sweeps, capacity searches): the single engine's when `fleet` is
    None, else the fleet's with its per-replica summaries left out and requests routed as a string."""
    if fleet is None:
        from kvsim.engine.sim import simulate
        return simulate(trace, cfg, keep_steps=False).summary
    summary = simulate_fleet(trace, cfg, fleet).summary
    section = {k: v for k, v in summary["fleet"].items() if k != "per_replica"}
    section["routed"] = " ".join(map(str, section["routed"]))
    return {**summary, "fleet": section}
