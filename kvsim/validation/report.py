"""The sim-to-real report (reports/sim-to-real): per run measured, predicted with the evidence-based
default profile, predicted after leave-one-out calibration, the errors; medians per metric, per GPU and
per model; the published simulators' errors on the same runs beside ours; the worst runs; figures."""

from __future__ import annotations

import pandas as pd

from kvsim.validation.compare import medians, medians_by, published, published_medians, rows, worst
from kvsim.validation.figures import latency_vs_rate, predicted_vs_measured
from kvsim.validation.metrics import DEFINITIONS, HEADLINE

_NAMES = {"e2e_ms": "e2e", "ttft_ms": "TTFT", "itl_ms": "ITL", "throughput_rps": "throughput"}


def _pct(v) -> str:
    return "-" if v is None else f"{v:.0f}%" if v >= 10 else f"{v:.1f}%"


def headline(default: dict, loo: dict, replays) -> str:
    """The one sentence README's first page carries."""
    done = [r for r in replays if not r.skip]
    versions = ", ".join(sorted({f"{r.gpu} ({sum(1 for q in done if q.gpu == r.gpu)})" for r in done}))
    d = ", ".join(f"{_NAMES[m]} {_pct(default[m])}" for m in HEADLINE)
    l = ", ".join(f"{_NAMES[m]} {_pct(loo[m])}" for m in HEADLINE)
    return (f"On {len(done)} measured vLLM servers (`real-runs/`: {versions}), kvsim's default profile misses by "
            f"a median of {d}; after leave-one-out calibration to the other runs (`kvsim calibrate`), by {l}.")


def _run_table(replays) -> pd.DataFrame:
    out = []
    for r in replays:
        row = {"run": r.name, "gpu": r.gpu, "model": r.model.split("/")[-1], "tp": r.tp,
               "overloaded_measured": r.overloaded, "not_replayed": r.skip or ""}
        meas, pred, loo = r.measured.get(-1, {}), r.predicted.get(-1, {}), (r.loo or {}).get(-1, {})
        from kvsim.validation.compare import ape
        for m in HEADLINE:
            row[f"{m}_measured"] = meas.get(m)
            row[f"{m}_default"] = pred.get(m)
            row[f"{m}_loo"] = loo.get(m)
            row[f"{m}_ape_default_pct"] = ape(meas.get(m), pred.get(m))
            row[f"{m}_ape_loo_pct"] = ape(meas.get(m), loo.get(m))
        row["note"] = r.note
        out.append(row)
    return pd.DataFrame(out)


def _medians_table(replays) -> pd.DataFrame:
    rows_out = []
    for label, key in (("default profile", "predicted"), ("leave-one-out calibrated", "loo")):
        med = medians(rows(replays, key=key))
        rows_out.append({"profile": label, "group": "all replayed", **{f"{m}_ape_pct": med[m] for m in HEADLINE}})
        for attr in ("gpu", "model"):
            for name, vals in medians_by(replays, attr, key=key).items():
                rows_out.append({"profile": label, "group": f"{attr} {name.split('/')[-1]} ({vals['runs']} runs)",
                                 **{f"{m}_ape_pct": vals[m] for m in HEADLINE}})
    return pd.DataFrame(rows_out)


def sim_to_real_report(replays, calibration, wall: dict):
    """A `kvsim.planning.reports.document.Report` of the replays (with `loo` filled) and the calibration result."""
    from kvsim.planning.reports.document import Report
    default, loo = medians(rows(replays)), medians(rows(replays, key="loo"))
    rep = Report("kvsim against real vLLM servers (sim-to-real)")
    rep.paragraph(headline(default, loo, replays))
    rep.paragraph(
        "Each run of the development set (`real-runs/`, its README gives sources and licences) is replayed "
        "with `kvsim validate`: the workload regenerated as the client sent it (inference-perf's "
        "`shared_prefix` as it actually ran: 100 fixed prompts re-sent in a shuffled cycle), the server's "
        "flags, and each metric as the client defines it. Errors are absolute percentage errors of whole-run "
        "means; medians are over the replayed runs. The default profile is fitted to nothing here. The "
        "leave-one-out column fits `kvsim calibrate`'s parameters on all other runs and predicts the run "
        "(per GPU: a GPU's efficiency and all-reduce latency come from its own other runs only, or stay at "
        "the evidence values).")
    rep.heading("Medians")
    rep.table("medians", _medians_table(replays), "Median APE (%) per metric: all runs, per GPU, per model.")
    rep.heading("Per run")
    table = _run_table(replays)
    show = {"run": "run", **{f"{m}_ape_{k}_pct": f"{_NAMES[m]} {lab}" for m in HEADLINE
                             for k, lab in (("default", "default %"), ("loo", "LOO %"))}, "not_replayed": "not replayed"}
    rep.table("runs", table, "APE (%) per run, default profile and leave-one-out calibrated; data/runs.csv holds "
              "the measured and predicted values.", show=show)
    rep.heading("Worst runs (default profile)")
    rep.table("worst", pd.DataFrame(worst(replays)), "The five runs with the largest mean APE, with the reason.")
    pub = published(replays)
    if pub:
        rep.heading("Published simulators on the same runs")
        pm = published_medians(pub)
        rep.table("published_medians", pd.DataFrame([{"simulator": k, **v} for k, v in pm.items()]),
                  "Median APE (%) over the runs that the sim-to-real study also gave to other simulators "
                  "(`published_simulator_predictions` in measured.json); kvsim with the default profile and "
                  "after leave-one-out calibration.")
        rep.table("published", pd.DataFrame(pub), "Per run and simulator, APE (%).")
    rep.heading("Calibration")
    cal = calibration.to_dict()
    share = "whole stages" if calibration.scale >= 1 else f"{calibration.scale:g} of each stage"
    rep.paragraph(f"Fitted by `kvsim calibrate` ({share}) on the runs whose figures cover every request "
                  f"({len(calibration.fitted_runs)} with rows), per GPU; the client path on the sustained "
                  f"HTTP-client runs: `client_fixed_s` = {calibration.client.fixed_s:.4g}.")
    rep.table("calibration", pd.DataFrame([{"GPU": g or "any other GPU", **{k: f"{v:.4g}" for k, v in vals.items()},
                                            "kept (why)": "; ".join(f"{k}: {w}" for k, w in
                                                                    calibration.kept.get(g, {}).items()) or "-"}
                                           for g, vals in calibration.by_gpu.items()]),
              "Fitted values per GPU, and what was kept and why (a GPU without runs takes the 'any other GPU' row).")
    rep.heading("Figures")
    rep.figure("predicted_vs_measured", predicted_vs_measured(replays, ("predicted", "loo")),
               "Predicted against measured, whole-run means; the diagonal is a perfect prediction.")
    rep.figure("e2e_vs_rate", latency_vs_rate(replays), "Mean e2e against stage rate: o measured, x kvsim default.")
    rep.heading("Definitions and wall times")
    clients = sorted({r.client for r in replays})
    rep.paragraph("\n".join(f"- {c} {m}: {DEFINITIONS[c][m]}" for c in clients for m in HEADLINE))
    rep.paragraph(f"Wall time (this machine, 2 shared cores): replay of all runs {wall['validate_s']:.0f} s; "
                  f"calibration with leave-one-out {wall['calibrate_s']:.0f} s.")
    return rep
