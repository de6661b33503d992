"""SLO attainment and goodput as DistServe defines them, for disaggregated runs and for colocated
replicas of today's engine on the same GPUs (the comparison `kvsim run --prefill-replicas` reports).

- TTFT: arrival to first token (for disaggregation, the prefill instance emits it).
- TPOT: (finish - first token) / (output tokens - 1); a one-token request has none and meets any TPOT SLO.
- Attainment: the fraction of all requests (rejected and unfinished ones count as misses) that meet
  both the TTFT and the TPOT SLO.
- Goodput: the highest request rate (req/s, the trace's arrivals rescaled to it) whose attainment is at
  least the target (DistServe: 90%), found by doubling then bisection to `rel_tol`.

Colocated replicas get the requests round-robin (request i on replica i mod R): each replica is then
an independent run of today's engine (`kvsim.engine.sim.simulate`) on its share of the trace.
Seconds throughout.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from kvsim.engine.config import SimConfig
from kvsim.engine.sim import simulate
from kvsim.fleet.disagg.sim import DisaggConfig, DisaggSim
from kvsim.trace.table import Trace, rescale_trace


def met_slos(columns: dict[str, np.ndarray], ttft_slo_s: float, tpot_slo_s: float) -> np.ndarray:
    """Per request: finished within both SLOs (`ttft_s`, `tpot_s`, `status` columns)."""
    tpot = columns["tpot_s"]
    return ((columns["status"] == "finished") & (columns["ttft_s"] <= ttft_slo_s)
            & (np.isnan(tpot) | (tpot <= tpot_slo_s)))


def attainment(columns: dict[str, np.ndarray], ttft_slo_s: float, tpot_slo_s: float) -> float:
    """Fraction of requests finished within both SLOs (`ttft_s`, `tpot_s`, `status` columns)."""
    ok = met_slos(columns, ttft_slo_s, tpot_slo_s)
    return float(ok.sum()) / len(ok) if len(ok) else 0.0


def _stats(x: np.ndarray) -> dict[str, float | None]:
    x = x[~np.isnan(x)]
    if not len(x):
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"mean": float(x.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def latency_summary(columns: dict[str, np.ndarray], ttft_slo_s: float, tpot_slo_s: float) -> dict:
    """Counts, TTFT and TPOT quantiles (s) of the finished requests, and the SLO attainment."""
    status = columns["status"]
    done = status == "finished"
    return {"requests": int(len(status)), "finished": int(done.sum()),
            "rejected": int((status == "rejected").sum()),
            "ttft_s": _stats(columns["ttft_s"][done]), "tpot_s": _stats(columns["tpot_s"][done]),
            "slo": {"ttft_s": ttft_slo_s, "tpot_s": tpot_slo_s,
                    "attainment": attainment(columns, ttft_slo_s, tpot_slo_s)}}


def disagg_summary(sim: DisaggSim, ttft_slo_s: float, tpot_slo_s: float) -> dict:
    """`latency_summary` plus the split, the link and the transfers (bytes, seconds, prefill-side wait)."""
    cols = sim.request_columns()
    out = latency_summary(cols, ttft_slo_s, tpot_slo_s)
    moved = ~np.isnan(cols["transfer_start_s"])
    cfg = sim.cfg
    out["disaggregation"] = {
        "prefill_replicas": cfg.prefill_replicas, "decode_replicas": cfg.decode_replicas,
        "prefill_tp": cfg.prefill.deployment.tp, "decode_tp": cfg.decode.deployment.tp, "gpus": cfg.gpus,
        "kv_link": cfg.link.name, "transfers": int(moved.sum()),
        "transfer_bytes": int((cols["prompt_tokens"][moved] * sim.kv_bytes_per_token).sum()),
        "transfer_s": _stats(cols["transfer_end_s"][moved] - cols["transfer_start_s"][moved]),
        "held_at_prefill_s": _stats(cols["transfer_start_s"][moved] - cols["first_token_s"][moved]),
        "prefill_busy_s": [inst.busy_s for inst in sim.prefill],
        "decode_busy_s": [inst.busy_s for inst in sim.decode]}
    return out


def run_disagg(trace: Trace, cfg: DisaggConfig, cost=None) -> DisaggSim:
    """Build and run one disaggregated simulation."""
    sim = DisaggSim(trace, cfg, cost)
    sim.run()
    return sim


def colocated_columns(trace: Trace, cfg: SimConfig, replicas: int, cost=None) -> dict[str, np.ndarray]:
    """TTFT, TPOT, status, arrival and finish (s) per request for `replicas` colocated engines fed
    round-robin."""
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    num = len(trace)
    ttft, tpot, finished = np.full(num, np.nan), np.full(num, np.nan), np.full(num, np.nan)
    status = np.empty(num, dtype=object)
    for r in range(replicas):
        idx = np.arange(r, num, replicas)
        if not len(idx):
            continue
        part = _take(trace, idx)
        cols = simulate(part, cfg, cost=cost, keep_steps=False).request_columns
        first, fin, out = cols["first_token_s"], cols["finished_s"], cols["output_tokens"]
        ttft[idx] = first - part.arrival_s
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot[idx] = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), np.nan)
        status[idx], finished[idx] = cols["status"], fin
    return {"ttft_s": ttft, "tpot_s": tpot, "status": status,
            "arrival_s": np.asarray(trace.arrival_s, dtype=float), "finished_s": finished}


def _take(trace: Trace, idx: np.ndarray) -> Trace:
    """The requests `idx` (sorted) of `trace`: arrivals and lengths (prefix data is not carried)."""
    return Trace.from_arrays(trace.arrival_s[idx], trace.prompt_tokens[idx], trace.output_tokens[idx])


def goodput(attainment_at: Callable[[float], float], target: float = 0.9, start_rps: float = 1.0,
            rel_tol: float = 0.05, max_rps: float = 1e4) -> tuple[float, dict[float, float]]:
    """The highest rate (req/s) with `attainment_at(rate) >= target` (doubling or halving from
    `start_rps`, then bisection until the bracket is within `rel_tol`), and every rate tried with its
    attainment. 0.0 when even `start_rps / 1024` misses."""
    if not 0 < target <= 1:
        raise ValueError(f"--slo-attainment must be in (0, 1], got {target}")
    tried: dict[float, float] = {}

    def ok(rate: float) -> bool:
        if rate not in tried:
            tried[rate] = attainment_at(rate)
        return tried[rate] >= target

    lo, hi = 0.0, start_rps
    if ok(hi):
        while ok(hi) and hi < max_rps:
            lo, hi = hi, hi * 2
    else:
        while not ok(hi / 2) and hi > start_rps / 1024:
            hi /= 2
        lo = hi / 2 if ok(hi / 2) else 0.0
    if lo == 0.0:
        return 0.0, tried
    while hi - lo > rel_tol * lo:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid)
    return lo, tried


def at_rate(trace: Trace, rate_rps: float) -> Trace:
    """`trace` with its arrivals rescaled to a mean rate of `rate_rps` req/s."""
    return rescale_trace(trace, rate_rps=rate_rps)
