"""Measured against predicted: absolute percentage error per metric and run, medians over runs.

APE = |predicted - measured| / measured x 100 (%). A run that could not be replayed (no such GPU, data
parallelism) has no errors and is listed with its reason; medians are over the runs that have the metric.
"""

from __future__ import annotations

import math
from statistics import median

from kvsim.validation.metrics import ENGINE_METRICS, HEADLINE, METRICS


def ape(measured: float | None, predicted: float | None) -> float | None:
    """Absolute percentage error (%), None when either is missing or the measurement is 0."""
    if measured is None or predicted is None or not math.isfinite(predicted) or not measured:
        return None
    return abs(predicted - measured) / abs(measured) * 100.0


def rows(replays, stage: int = -1, key: str = "predicted") -> list[dict]:
    """One dict per (run, metric) at `stage`: run, metric, measured, predicted, ape_pct (None where not
    replayed); `key` picks which prediction ("predicted", or "loo" after calibration). The engine-side
    metrics appear for the runs that measured them."""
    out = []
    for r in replays:
        meas = r.measured.get(stage, {})
        pred = (getattr(r, key) or {}).get(stage, {})
        for m in METRICS + ENGINE_METRICS:
            if m not in meas:
                continue
            out.append({"run": r.name, "metric": m, "measured": meas[m], "predicted": pred.get(m),
                        "ape_pct": ape(meas[m], pred.get(m))})
    return out


def medians(table: list[dict], metrics=HEADLINE) -> dict[str, float | None]:
    """{metric: median APE over the runs that have it} (None when none has)."""
    out = {}
    for m in metrics:
        errors = [row["ape_pct"] for row in table if row["metric"] == m and row["ape_pct"] is not None]
        out[m] = median(errors) if errors else None
    return out


def medians_by(replays, attribute: str, stage: int = -1, key: str = "predicted") -> dict[str, dict]:
    """{value of `attribute` (gpu, model): medians} over the replayed runs with that value."""
    groups: dict[str, list] = {}
    for r in replays:
        groups.setdefault(str(getattr(r, attribute)), []).append(r)
    return {name: {"runs": len(group), **medians(rows(group, stage, key))} for name, group in sorted(groups.items())}


def worst(replays, n: int = 5, key: str = "predicted") -> list[dict]:
    """The `n` runs with the largest mean headline APE, with the metric that misses most."""
    scored = []
    for r in replays:
        table = [row for row in rows([r], key=key) if row["metric"] in HEADLINE and row["ape_pct"] is not None]
        if not table:
            continue
        top = max(table, key=lambda row: row["ape_pct"])
        scored.append({"run": r.name, "mean_ape_pct": sum(row["ape_pct"] for row in table) / len(table),
                       "worst_metric": top["metric"], "worst_ape_pct": top["ape_pct"], "note": r.note})
    return sorted(scored, key=lambda s: -s["mean_ape_pct"])[:n]


def published(replays, metric_keys=(("e2e_ms", "-1:e2e_mean"), ("ttft_ms", "-1:ttft_mean"),
                                    ("itl_ms", "-1:itl_mean"))) -> list[dict]:
    """Other simulators' published APE (%) on the same runs beside ours: one row per run and
    simulator (and one for kvsim), for the runs that have published predictions."""
    out = []
    for r in replays:
        if not r.published:
            continue
        for key, label in (("predicted", "kvsim"), ("loo", "kvsim (leave-one-out calibrated)")):
            if not getattr(r, key):
                continue
            ours = {m: row["ape_pct"] for row in rows([r], key=key) for m, _ in metric_keys if row["metric"] == m}
            out.append({"run": r.name, "simulator": label, **{m: ours.get(m) for m, _ in metric_keys}})
        for sim, preds in sorted(r.published.items()):
            vals = {m: (preds.get(k) or {}).get("mape") for m, k in metric_keys}
            out.append({"run": r.name, "simulator": sim, **vals})
    return out


def published_medians(table: list[dict], metrics=("e2e_ms", "ttft_ms", "itl_ms")) -> dict[str, dict]:
    """{simulator: {metric: median APE over its runs}, "runs": count} from `published` rows."""
    sims: dict[str, list[dict]] = {}
    for row in table:
        sims.setdefault(row["simulator"], []).append(row)
    out = {}
    for sim, group in sims.items():
        out[sim] = {"runs": len(group)}
        for m in metrics:
            vals = [row[m] for row in group if row[m] is not None]
            out[sim][m] = median(vals) if vals else None
    return out
