"""The fleet section of a capacity-planning report (`kvsim report TRACE --replicas 4,16`): the routers
compared on the trace at each fleet size (prefix-cache hit rate, TTFT, imbalance between replicas), and
when asked (`--pd 1:3,2:2`) colocated replicas against prefill/decode splits on the same GPUs (TTFT,
TPOT and SLO attainment as DistServe defines them, kvsim/fleet/disagg/slo.py).

Every fleet is `kvsim.fleet.sim.simulate_fleet` on the report's deployment (one replica = the whole
deployment, its TP GPUs); every split `kvsim.fleet.disagg.plan.simulate_disagg` with both sides at the
deployment's TP. Seconds throughout; hit rates and attainment are fractions (shown as %).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from kvsim.fleet.config import FLEET_FLAGS, FleetConfig, fleet_from_flags
from kvsim.fleet.disagg.plan import simulate_disagg
from kvsim.fleet.disagg.slo import attainment
from kvsim.fleet.sim import simulate_fleet
from kvsim.planning.reports import figures
from kvsim.planning.reports.metric_labels import metric
from kvsim.planning.reports.document import Report
from kvsim.planning.runs import make_config
from kvsim.trace.table import Trace

#: The routers table's columns on the page (all go to `data/fleet_routers.csv`), with their headers.
ROUTER_SHOW = {"replicas": "replicas", "router": "router", "gpus": "GPUs", "prefix_cache_hit_rate": "prefix hits",
               "ttft_s_p50": "TTFT p50 (s)", "ttft_s_p99": "TTFT p99 (s)", "tpot_s_p99": "TPOT p99 (s)",
               "requests_max_over_mean": "requests max/mean", "kv_used_max_over_mean": "KV used max/mean",
               "requests_finished": "finished"}
SPLIT_SHOW = {"layout": "layout", "gpus": "GPUs", "ttft_s_p50": "TTFT p50 (s)", "ttft_s_p99": "TTFT p99 (s)",
              "tpot_s_p50": "TPOT p50 (s)", "tpot_s_p99": "TPOT p99 (s)", "slo_attainment": "SLO attainment",
              "requests_finished": "finished"}


def _latency(columns: dict, arrival: np.ndarray) -> dict[str, np.ndarray]:
    """TTFT and TPOT per request (s; NaN where none) and status, from a run's request columns."""
    first, fin, out = columns["first_token_s"], columns["finished_s"], columns["output_tokens"]
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(out > 1, (fin - first) / np.maximum(out - 1, 1), np.nan)
    return {"ttft_s": first - arrival, "tpot_s": tpot, "status": columns["status"]}


def _quantiles(cols: dict, ttft_slo: float, tpot_slo: float) -> dict:
    done = cols["status"] == "finished"
    row = {"requests_finished": int(done.sum()), "slo_attainment": attainment(cols, ttft_slo, tpot_slo)}
    for name in ("ttft_s", "tpot_s"):
        x = cols[name][done]
        x = x[~np.isnan(x)]
        p50, p99 = np.percentile(x, [50, 99]) if len(x) else (np.nan, np.nan)
        row[f"{name}_p50"], row[f"{name}_p99"] = float(p50), float(p99)
    return row


def fleet_rows(trace: Trace, flags: dict, replicas: Sequence[int], routers: Sequence[str],
               ttft_slo: float = 0.2, tpot_slo: float = 0.1) -> pd.DataFrame:
    """One row per (fleet size, router): the fleet's figures (`ROUTER_SHOW`, plus SLO attainment and the
    router's decisions). `flags`: run flags (`kvsim.make_config`), fleet thresholds among them
    (`FLEET_FLAGS`: `router_balance_abs` ...) apply to every fleet."""
    base = fleet_from_flags({k: v for k, v in flags.items() if k in FLEET_FLAGS and k not in ("replicas", "router")})
    cfg = make_config(**{k: v for k, v in flags.items() if k not in FLEET_FLAGS})
    rows = []
    for n in replicas:
        for router in routers:
            fleet = FleetConfig(n, router, *((base.balance_abs, base.balance_rel, base.cache_threshold)
                                              if base is not None else ()))
            res = simulate_fleet(trace, cfg, fleet)
            s, f = res.summary, res.summary["fleet"]
            lat = _quantiles(_latency(res.request_columns, np.asarray(trace.arrival_s)), ttft_slo, tpot_slo)
            rows.append({"replicas": n, "router": router, "gpus": f["gpus"],
                         "prefix_cache_hit_rate": s["prefix_cache_hit_rate"], **lat,
                         "requests_max_over_mean": f["imbalance"]["requests_max_over_mean"],
                         "kv_used_max_over_mean": f["imbalance"]["kv_used_max_over_mean"],
                         "decisions": " ".join(f"{k}={v}" for k, v in f["decisions"].items())})
    return pd.DataFrame(rows)


def split_rows(trace: Trace, flags: dict, splits: Sequence[tuple[int, int]], ttft_slo: float, tpot_slo: float,
               kv_link: str = "nvlink") -> pd.DataFrame:
    """One row per P:D split (`split_rows` columns as `SPLIT_SHOW`), both sides at the deployment's TP."""
    cfg = make_config(**{k: v for k, v in flags.items() if k not in FLEET_FLAGS})
    rows = []
    for p, d in splits:
        sim = simulate_disagg(trace, cfg, p, d, kv_link=kv_link)
        cols = sim.request_columns()
        rows.append({"layout": f"{p}P:{d}D ({kv_link})", "gpus": sim.cfg.gpus,
                     **_quantiles({k: cols[k] for k in ("ttft_s", "tpot_s", "status")}, ttft_slo, tpot_slo)})
    return pd.DataFrame(rows)


def fleet_section(report: Report, trace: Trace, flags: dict, replicas: Sequence[int], routers: Sequence[str],
                  splits: Sequence[tuple[int, int]] = (), ttft_slo: float = 0.2, tpot_slo: float = 0.1,
                  kv_link: str = "nvlink") -> pd.DataFrame:
    """Add the fleet section (module docstring) to `report`; returns the routers table."""
    df = fleet_rows(trace, flags, replicas, routers, ttft_slo, tpot_slo)
    report.heading("Fleets: routers compared")
    report.paragraph(
        f"The trace replayed by fleets of {', '.join(map(str, replicas))} replicas (each the deployment above, "
        f"its own KV cache, scheduler and prefix cache) behind each router (docs/fleet.md). Prefix hits: "
        "hit tokens over admitted prompt tokens, all replicas together; max/mean: the busiest replica "
        "against the mean, in requests served and in time-averaged KV in use (1.0 is even).")
    report.table("fleet_routers", df, show=ROUTER_SHOW, percent=["prefix_cache_hit_rate", "slo_attainment"])
    report.paragraph(router_verdict(df))
    d = df.assign(fleet=[f"{n} replicas" for n in df.replicas])
    hits = metric("prefix_cache_hit_rate")
    report.figure("fleet_prefix_hits", figures.grouped_bars(
        d.assign(pct=100 * d.prefix_cache_hit_rate), "fleet", "pct", "router", hits.axis(),
        "Prefix-cache hit rate by router"))
    report.figure("fleet_ttft_p99", figures.grouped_bars(d, "fleet", "ttft_s_p99", "router",
                                                         metric("ttft_s_p99").axis(), "TTFT p99 by router"))
    report.figure("fleet_imbalance", figures.grouped_bars(
        d, "fleet", "requests_max_over_mean", "router", metric("requests_max_over_mean").axis(),
        "Requests on the busiest replica over the mean"))
    if splits:
        _split_part(report, trace, flags, df, splits, routers, ttft_slo, tpot_slo, kv_link)
    return df


def _split_part(report: Report, trace: Trace, flags: dict, fleets: pd.DataFrame, splits, routers, ttft_slo,
                tpot_slo, kv_link) -> None:
    """Colocated fleets against P:D splits of the same GPU counts."""
    tp = make_config(**{k: v for k, v in flags.items() if k not in FLEET_FLAGS}).deployment.tp
    sizes = sorted({p + d for p, d in splits})
    missing = [n for n in sizes if n not in set(fleets.replicas)]
    colocated = pd.concat([fleets, fleet_rows(trace, flags, missing, routers, ttft_slo, tpot_slo)]) if missing \
        else fleets
    colocated = colocated[colocated.replicas.isin(sizes)]
    rows = colocated.assign(layout=[f"{n} colocated, {r}" for n, r in zip(colocated.replicas, colocated.router)])
    table = pd.concat([rows[list(SPLIT_SHOW)], split_rows(trace, flags, splits, ttft_slo, tpot_slo, kv_link)],
                      ignore_index=True).sort_values("gpus", kind="stable")
    report.heading("Colocated against prefill/decode disaggregation")
    report.paragraph(
        f"The same GPUs ({', '.join(str(n * tp) for n in sizes)}) as colocated replicas or as P prefill and "
        f"D decode instances (TP {tp} each, the KV cache of each request moved over {kv_link}, "
        "kvsim/fleet/disagg/sim.py). TTFT ends at the first token; TPOT is (finish - first token) / (output "
        f"tokens - 1); SLO attainment: requests within TTFT <= {ttft_slo:g} s and TPOT <= {tpot_slo:g} s "
        "(`--ttft-slo`, `--tpot-slo`), rejected and unfinished ones counted as misses (DistServe's "
        "definitions).")
    report.table("fleet_vs_disagg", table, show=SPLIT_SHOW, percent=["slo_attainment"])
    best = table.loc[table.slo_attainment.idxmax()]
    report.paragraph(f"Highest SLO attainment on {best.gpus:g} GPUs: {best.layout}, {best.slo_attainment:.1%}"
                     + "".join(f"; best on {g:g} GPUs: {t.layout}, {t.slo_attainment:.1%}" for g, t in
                               ((g, t.loc[t.slo_attainment.idxmax()]) for g, t in table.groupby("gpus"))
                               if g != best.gpus) + " (one trace as given, not a steady-state verdict: "
                     "`kvsim capacity --gpus-for RATE --disagg` judges layouts at steady state). "
                     + slo_fit_note(table, ttft_slo, tpot_slo))
    report.figure("fleet_vs_disagg", figures.bars(dict(zip(table.layout, 100 * table.slo_attainment)),
                                                  metric("slo_attainment").axis(), "SLO attainment by layout"))


def fleet_report(trace: Trace, title: str, flags: dict, replicas: Sequence[int], routers: Sequence[str],
                 splits: Sequence[tuple[int, int]] = (), ttft_slo: float = 0.2, tpot_slo: float = 0.1,
                 kv_link: str = "nvlink") -> Report:
    """A report of the workload and the fleet section alone (`kvsim report --fleet-only`)."""
    from kvsim.planning.reports.build import workload_table
    dep = make_config(**{k: v for k, v in flags.items() if k not in FLEET_FLAGS}).deployment
    report = Report(title or f"Fleet plan: {trace.source or 'trace'} on {dep.model.name}, {dep.tp} x {dep.gpu.name} "
                             "per replica")
    report.heading("Workload and deployment")
    report.table("workload", workload_table(trace))
    report.paragraph(f"Each replica: model {dep.model.name} on {dep.tp} x {dep.gpu.name}; run flags: "
                     + (", ".join(f"`{k}={v}`" for k, v in sorted(flags.items()) if v is not None) or "defaults")
                     + ".")
    long = int((trace.prompt_tokens + trace.output_tokens > dep.model.max_seq_len).sum())
    if long:                     # every layout rejects these: said once, with the reason
        report.paragraph(f"{long:,} of {len(trace):,} requests are longer than the model's maximum "
                         f"({dep.model.max_seq_len:,} tokens, prompt + output): every layout rejects them, "
                         "and SLO attainment counts them as misses.")
    fleet_section(report, trace, flags, replicas, routers, splits, ttft_slo, tpot_slo, kv_link)
    return report


#: Best attainment under which the SLO is said not to fit the workload (no layout serves half its
#: requests within it: the comparison says more about the SLO than about the layouts).
FIT_BELOW = 0.5


def slo_fit_note(table: pd.DataFrame, ttft_slo: float, tpot_slo: float) -> str:
    """Whose SLO this is, and, when no layout attains FIT_BELOW of it, that it does not fit the workload,
    with the best layout's medians to choose one from ('' columns missing)."""
    best = table.loc[table.slo_attainment.idxmax()]
    text = (f"The SLO is the user's (`--ttft-slo {ttft_slo:g}`, `--tpot-slo {tpot_slo:g}`; DistServe's "
            "defaults when not given).")
    if best.slo_attainment >= FIT_BELOW:
        return text
    return text + (f" It does not fit this workload: the best layout ({best.layout}) serves "
                   f"{100 * best.slo_attainment:.0f}% of requests within it, with TTFT p50 {best.ttft_s_p50:.3g} s "
                   f"and TPOT p50 {best.tpot_s_p50:.3g} s; an SLO near those would compare the layouts.")


def router_verdict(df: pd.DataFrame, close: float = 0.05) -> str:
    """Which router to pick at each fleet size of `fleet_rows`' table, in words: the lowest TTFT p99, the
    routers within `close` of it (no difference worth a choice on this trace), and the most prefix hits."""
    parts = []
    for n, g in df.groupby("replicas", sort=True):
        g = g.dropna(subset=["ttft_s_p99"])
        if g.empty:
            continue
        best = g.loc[g.ttft_s_p99.idxmin()]
        near = [r for r, t in zip(g.router, g.ttft_s_p99) if r != best.router and t <= best.ttft_s_p99 * (1 + close)]
        hits = g.loc[g.prefix_cache_hit_rate.idxmax()]
        text = f"At {n} replicas the lowest TTFT p99 is {best.router}'s ({best.ttft_s_p99:.3g} s)"
        text += (f"; {', '.join(near)} within {close:.0%} of it (no difference worth a choice on this trace)"
                 if near else f", more than {close:.0%} below every other router")
        text += (f"; the most prefix-cache hits, {hits.prefix_cache_hit_rate:.1%}, are {hits.router}'s."
                 if hits.prefix_cache_hit_rate > 0 else "; no router finds a prefix-cache hit on this trace.")
        parts.append(text)
    return " ".join(parts)
