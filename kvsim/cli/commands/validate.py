"""`kvsim validate` (replay measured vLLM runs, compare per metric) and `kvsim calibrate` (fit named
profile parameters to them, with leave-one-out error). Bad input: one line naming it, exit 2."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

RunsArg = typer.Argument(..., help="Measured runs: folders as real-runs/* (server.json, workload.json or "
                         "requests.jsonl, measured.json), a folder of them, an inference-perf report folder "
                         "(results/config.yaml, stage_N_ and summary_lifecycle_metrics.json), a `vllm bench "
                         "serve --save-result` JSON or a per-request JSONL (these two with --server).")
ServerOpt = typer.Option(None, "--server", help="server.json (model, hf_config, gpu, TP, vLLM flags; as "
                         "real-runs/*/server.json) for a single-file run or an inference-perf folder.")
GpuOpt = typer.Option(None, "--gpu", help="kvsim GPU preset to use instead of the run's own GPU name.")
ScaleOpt = typer.Option(1.0, "--scale", min=0.01, max=1.0, help="Shorten each generated stage to this "
                        "share of its duration (same rate); replayed request lists keep this share.")
SeedOpt = typer.Option(0, "--seed", help="Seed of what the run did not record (prompt shuffle, arrivals).")


def _write_json(path: Path, doc: dict, flag: str) -> None:
    import json
    from kvsim.files import write_text_atomic
    write_text_atomic(path, json.dumps(doc, indent=1, allow_nan=False) + "\n", flag)


def validate_cmd(runs: List[Path] = RunsArg, server: Optional[Path] = ServerOpt,
                 engine_profile: str = typer.Option("vllm-v1", "--engine-profile", help="Engine profile: a "
                                                    "name, or a JSON file from `kvsim calibrate`."),
                 gpu: Optional[str] = GpuOpt, scale: float = ScaleOpt, seed: int = SeedOpt,
                 json_out: Optional[Path] = typer.Option(None, "--json", help="Write the comparison as "
                                                         "strict JSON here."),
                 figure: Optional[Path] = typer.Option(None, "--figure", help="Write predicted against "
                                                       "measured (PNG) here."),
                 requests_out: Optional[Path] = typer.Option(None, "--requests", help="Write every predicted "
                                                             "request's times (CSV: vLLM's queued/scheduled/"
                                                             "first/last token timestamps in s, queue, engine "
                                                             "TTFT, prefill, decode and the client's TTFT and "
                                                             "e2e in ms) here."),
                 quiet: bool = typer.Option(False, "--quiet", help="No table.")) -> None:
    """Replay measured vLLM runs through kvsim with the server's flags: per run and metric the measured
    value, the prediction and the absolute percentage error (%), with medians over runs; the client's
    metrics, then the engine-side ones (vLLM's request timestamps)."""
    from kvsim.files import check_output_file, write_text_atomic
    from kvsim.validation.run_set import document, profile_and_path, read_runs, replay_all, requests_csv, text_table
    for path, flag in ((json_out, "--json"), (figure, "--figure"), (requests_out, "--requests")):
        if path is not None:
            check_output_file(path, flag)
    profile, client = profile_and_path(engine_profile)
    measured = read_runs(runs, server)
    start = time.perf_counter()
    replays = replay_all(measured, profile, client, gpu, seed, scale)
    wall = time.perf_counter() - start
    if not quiet:
        typer.echo(text_table(replays))
        typer.echo(f"{len(replays)} runs ({sum(1 for r in replays if r.skip)} not replayed) in {wall:.1f} s; "
                   f"engine profile {getattr(profile, 'name', engine_profile)}")
    if json_out is not None:
        _write_json(json_out, document(replays, getattr(profile, "name", engine_profile), client, wall), "--json")
    if requests_out is not None:
        write_text_atomic(requests_out, requests_csv(replays), "--requests")
    if figure is not None:
        from kvsim.planning.reports.document import png_bytes
        from kvsim.files import atomic_write
        from kvsim.validation.figures import predicted_vs_measured
        data = png_bytes(predicted_vs_measured(replays))
        with atomic_write(figure, "wb", encoding=None, flag="--figure") as f:
            f.write(data)


def calibrate_cmd(runs: List[Path] = RunsArg, out: Path = typer.Option(..., "--out", "-o", help="Profile JSON "
                                                                       "to write (use with --engine-profile)."),
                  server: Optional[Path] = ServerOpt,
                  base: str = typer.Option("vllm-v1", "--base", help="Profile the fitted one starts from."),
                  gpu: Optional[str] = GpuOpt,
                  scale: float = typer.Option(1.0, "--scale", min=0.01, max=1.0, help="Share of each "
                                              "stage's duration simulated while fitting (shortened "
                                              "traces; the leave-one-out check uses the same)."),
                  seed: int = SeedOpt,
                  json_out: Optional[Path] = typer.Option(None, "--json", help="Write the fit, its "
                                                          "leave-one-out errors and the runs as JSON here."),
                  no_loo: bool = typer.Option(False, "--no-loo", help="Skip the leave-one-out check.")) -> None:
    """Fit CPU time per step and per sequence, GPU kernel-time scale, all-reduce latency and the client
    path to measured runs; write an engine profile and report the leave-one-out error."""
    from kvsim.files import check_output_file
    from kvsim.cost.profiles import get_profile
    from kvsim.validation.fit import calibrate, profile_document
    from kvsim.validation.run_set import read_runs
    check_output_file(out, "-o")
    if json_out is not None:
        check_output_file(json_out, "--json")
    base_profile = get_profile(base)
    measured = read_runs(runs, server)
    start = time.perf_counter()
    result = calibrate(measured, base_profile, gpu=gpu, seed=seed, scale=scale, loo=not no_loo,
                       progress=lambda text: typer.echo(text, err=True))
    result.wall_s = time.perf_counter() - start
    _write_json(out, profile_document(result, out.stem, [str(p) for p in runs]), "-o")
    if json_out is not None:
        _write_json(json_out, result.to_dict(), "--json")
    typer.echo(result.text())
    typer.echo(f"wrote {out} ({result.wall_s:.0f} s)")


def sim_to_real_cmd(runs: List[Path] = typer.Argument(..., help="Measured run folders (or a folder of them)."),
                    out: Path = typer.Option(Path("reports/sim-to-real"), "-o", "--out", help="Report folder."),
                    scale: float = typer.Option(1.0, "--scale", min=0.01, max=1.0, help="Share of each stage "
                                                "simulated for the calibration (the default-profile replay "
                                                "always runs whole stages)."),
                    force: bool = typer.Option(False, "--force", help="Replace an existing report folder.")) -> None:
    """The sim-to-real report: per run measured, predicted with the default profile and after
    leave-one-out calibration, errors, medians, published simulators beside kvsim, figures."""
    from kvsim.cli.commands.report import _out_folder, _write_report
    from kvsim.cost.profiles import DEFAULT_PROFILE, get_profile
    from kvsim.validation.fit import calibrate
    from kvsim.validation.report import sim_to_real_report
    from kvsim.validation.run_set import read_runs, replay_all
    _out_folder(out, force, "-o")
    measured = read_runs(runs)
    start = time.perf_counter()
    replays = replay_all(measured)
    validate_s = time.perf_counter() - start
    start = time.perf_counter()
    cal = calibrate(measured, get_profile(DEFAULT_PROFILE), scale=scale,
                    defaults=replays if scale == 1.0 else None)
    calibrate_s = time.perf_counter() - start
    if scale != 1.0:
        for rep, fitted in zip(replays, cal.replays):
            rep.loo = fitted.loo
    _write_report(sim_to_real_report(replays, cal, {"validate_s": validate_s, "calibrate_s": calibrate_s}),
                  out, force, "-o")
    typer.echo(f"wrote {out}/report.md and {out}/report.html")
