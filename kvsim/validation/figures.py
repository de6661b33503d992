"""Figures of a validation: predicted against measured per metric (log axes, the diagonal is a perfect
prediction), and latency against rate per run with the measured points (one panel per model)."""

from __future__ import annotations

from matplotlib.figure import Figure

from kvsim.validation.metrics import HEADLINE

_LABELS = {"e2e_ms": "mean e2e (ms)", "ttft_ms": "mean TTFT (ms)", "itl_ms": "ITL (ms)",
           "throughput_rps": "throughput (req/s)"}


def predicted_vs_measured(replays, keys=("predicted",)) -> Figure:
    """One panel per headline metric: each run's prediction (`keys`: "predicted", "loo") against its
    measurement, whole run."""
    fig = Figure(figsize=(12, 3.4))
    axes = fig.subplots(1, len(HEADLINE))
    markers = {"predicted": ("o", "default profile"), "loo": ("x", "leave-one-out calibrated")}
    for ax, m in zip(axes, HEADLINE):
        lo, hi = float("inf"), 0.0
        for key in keys:
            xs, ys = [], []
            for r in replays:
                meas, pred = r.measured.get(-1, {}).get(m), (getattr(r, key) or {}).get(-1, {}).get(m)
                if meas and pred and pred > 0:
                    xs.append(meas)
                    ys.append(pred)
            if xs:
                marker, label = markers.get(key, ("o", key))
                ax.scatter(xs, ys, marker=marker, label=label, s=18)
                lo, hi = min(lo, *xs, *ys), max(hi, *xs, *ys)
        if hi > 0:
            ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_title(_LABELS[m], fontsize=9)
        ax.set_xlabel("measured", fontsize=8)
    axes[0].set_ylabel("predicted")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig


def latency_vs_rate(replays, metric: str = "e2e_ms") -> Figure:
    """Mean `metric` against the stage's rate (req/s) for runs with several stages or rates: measured
    points and the prediction's, one line per run, one panel per model."""
    models = sorted({r.model for r in replays if not r.skip})
    fig = Figure(figsize=(4 * max(len(models), 1), 3.4))
    axes = fig.subplots(1, max(len(models), 1), squeeze=False)[0]
    for ax, model in zip(axes, models):
        for r in (r for r in replays if r.model == model and not r.skip):
            stages = sorted(k for k in r.measured if k >= 0 and "rate" in r.measured[k])
            if not stages:
                continue
            rates = [r.measured[k]["rate"] for k in stages]
            line = ax.plot(rates, [r.measured[k][metric] for k in stages], "o-", ms=4, label=r.name.split("-")[-1])
            pred = [r.predicted.get(k, {}).get(metric) for k in stages]
            if all(p is not None for p in pred):
                ax.plot(rates, pred, "x--", ms=5, color=line[0].get_color())
        ax.set_yscale("log")
        ax.set_title(model.split("/")[-1], fontsize=9)
        ax.set_xlabel("rate (req/s)", fontsize=8)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, title="o measured, x kvsim", title_fontsize=6)
    axes[0].set_ylabel(_LABELS.get(metric, metric))
    fig.tight_layout()
    return fig
