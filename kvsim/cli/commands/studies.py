"""The study commands: `kvsim paper` (the vLLM paper's experiments) and `kvsim hybrid-study` (hybrid
models under each KV cache manager); both write a report folder through the output policy of
`kvsim.cli.commands.report`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import typer

from kvsim.cli import bounds
from kvsim.cli.commands.plan import _user_errors
from kvsim.cli.commands.report import ForceOpt, WorkersOpt, _out_folder, _write_report


def paper_cmd(
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Report folder (default reports/vllm-paper; "
                                       "with --quick out/vllm-paper-quick, so the shipped report stays)."),
    quick: bool = typer.Option(False, "--quick", help="OPT-13B only, 30 s traces, 2 rates, 3 block sizes "
                               "(seconds; for tests)."),
    duration: Optional[float] = typer.Option(None, "--duration", help="Trace length per run, seconds "
                                             "(default: one hour, as the paper; 30 with --quick)."),
    whole_runs: bool = typer.Option(False, "--whole-runs", help="Run every latency-curve point to its end "
                                    "(default: a point past a knee stops once surely above the plots' 1 "
                                    "s/token ceiling and shows as '> 1'; capacities are the same)."),
    workers: Optional[int] = WorkersOpt, force: bool = ForceOpt,
) -> None:
    """The vLLM paper's experiments (OPT-13B/66B/175B, ShareGPT- and Alpaca-like): latency against rate
    per system, memory breakdown, batched requests, block size, recompute against swap; our numbers beside
    the published ones."""
    out = out or Path("out/vllm-paper-quick" if quick else "reports/vllm-paper")
    with _user_errors():
        _out_folder(out, force, "-o")
        bounds.workers(workers)
        from dataclasses import replace as _replace
        from kvsim.planning.paper.experiments import FULL, QUICK, run_paper
        from kvsim.planning.paper.report import paper_report
        plan = QUICK if quick else FULL
        if duration is not None:
            bounds.duration(duration, "--duration")
            plan = _replace(plan, duration_s=duration)
        res = run_paper(plan, workers=workers or os.cpu_count(), ceiling=not whole_runs)
        _write_report(paper_report(res), out, force, "-o")
    typer.echo(f"wrote {out}/report.md and {out}/report.html ({res.wall_s:.0f} s of runs)")


def hybrid_study_cmd(
    out: Optional[Path] = typer.Option(None, "-o", "--out", help="Report folder (default reports/hybrid-models; "
                                       "with --quick out/hybrid-models-quick, so the shipped report stays)."),
    quick: bool = typer.Option(False, "--quick", help="gpt-oss-120b on the ShareGPT-like trace only, 30 s "
                               "(seconds; for tests)."),
    duration: float = typer.Option(600.0, help="Trace length, seconds (ignored with --quick)."),
    force: bool = ForceOpt,
) -> None:
    """Hybrid models (gpt-oss, Gemma 3, Llama 4) under uniform pages, vLLM's hybrid KV cache manager and
    contiguous reservations: start-up figures, simulated batch and KV per request; Jenga's published
    figures beside ours."""
    from dataclasses import replace

    out = out or Path("out/hybrid-models-quick" if quick else "reports/hybrid-models")
    with _user_errors():
        bounds.duration(duration)
        _out_folder(out, force, "-o")
        from kvsim.planning.studies.hybrid_report import hybrid_report
        from kvsim.planning.studies.hybrid import QUICK, StudyPlan, run_study
        plan = QUICK if quick else replace(StudyPlan(), duration_s=duration)
        _write_report(hybrid_report(run_study(plan), plan), out, force, "-o")
    typer.echo(f"wrote {out}/report.md and {out}/report.html")
