"""`kvsim sweep`: a grid of runs into one table, with a summary of what ran (registered by kvsim.cli.lazy).

Bad input — an empty grid, an unknown key, a key given twice, a value not of its key's type, a folder
another sweep is writing, `--ray` without Ray — is one message on stderr and exit status 2, before any
run starts or anything is written. Rows that `--resume` cannot trust are named on stderr and run again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from kvsim.cli.commands.plan import PresetOpt, TraceArg, _literal, _pairs, _user_errors

#: Lower is better; the vLLM paper's main serving metric (mean end-to-end latency / output length).
MAIN_METRIC = "normalized_latency_s_per_token"


def _grid(items: list[str]) -> dict[str, list]:
    """--grid flag=v1,v2 arguments -> flag -> values; a flag given twice is an error."""
    from kvsim.planning.runs import normalize_flag

    values: dict[str, list] = {}
    for key, text in _pairs(items, "--grid"):
        name = normalize_flag(key)
        if name in values:
            raise ValueError(f"--grid {name} is given twice; list all its values once ({name}=v1,v2,...)")
        values[name] = [_literal(v) for v in text.split(",") if v.strip()]
    return values


def sweep(
    trace: Optional[Path] = TraceArg, preset: Optional[str] = PresetOpt,
    grid: List[str] = typer.Option([], "--grid", metavar="FLAG=V1,V2", help="Values of one run flag (any "
                                   "`kvsim run` flag, _ or -, e.g. block_size=8,16,32), or of rate (req/s), "
                                   "duration_s (s), time_scale, num_requests (a preset's), max_requests (a "
                                   "trace's), trace (files), preset; repeatable: the grid is the cross "
                                   "product. A flag given twice, or also in --set, is an error."),
    set_flags: List[str] = typer.Option([], "--set", metavar="FLAG=VALUE", help="A flag fixed for every "
                                        "run (e.g. --set kv_gib=12 --set rate=2); repeatable."),
    out: Path = typer.Option(..., "-o", "--out", help="Folder for results.parquet, results.csv, rows.jsonl "
                             "(locked while the sweep runs: a second sweep on it is refused)."),
    workers: Optional[int] = typer.Option(None, "--workers", min=1, help="Processes (default: all cores)."),
    ray: bool = typer.Option(False, "--ray", help="Run as Ray tasks on a local Ray instance (kvsim[dist])."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="Existing Ray cluster, host:port."),
    resume: bool = typer.Option(False, "--resume", help="Skip grid points already finished in --out (rows "
                                "that do not match their point are named and run again)."),
) -> None:
    """Run a grid of configurations on TRACE or a --preset: one row per run (every config field and
    summary metric; failed runs with their error) in Parquet and CSV, written as runs finish."""
    from kvsim.cli.output import err_console
    from kvsim.planning.runs import normalize_flag
    from kvsim.planning.sweep.runner import run_sweep

    def warn(message: str) -> None:
        err_console.print(f"warning: {message}", markup=False, highlight=False, soft_wrap=True)

    with _user_errors():
        if trace is not None and preset is not None:
            raise ValueError("give a TRACE or --preset, not both")
        values = _grid(grid)
        base: dict = {}
        for key, text in _pairs(set_flags, "--set"):
            name = normalize_flag(key)
            if name in values:
                raise ValueError(f"{name} is in both --grid and --set; give it once")
            base[name] = _literal(text)
        for key, given in (("preset", preset), ("trace", trace)):
            if given is not None and key in {*values, *base}:
                raise ValueError(f"give --{key} or --grid {key}, not both" if key == "preset"
                                 else "give a TRACE or --grid trace, not both")
        if trace is None and preset is None and not {"trace", "preset"} & {*values, *base}:
            preset = "sharegpt"
        from kvsim.planning.kernel_check import kernel_warnings
        for message in kernel_warnings(values.get("block_size", [base.get("block_size")]),
                                       values.get("engine_profile", [base.get("engine_profile")])):
            warn(message)
        start = time.perf_counter()
        df = run_sweep(values, base, trace=trace, preset=preset, workers=workers, ray=ray,
                       ray_address=ray_address, out_dir=out, resume=resume, progress=True, warn=warn)
    _print_summary(df, list(values), out, time.perf_counter() - start)


def _print_summary(df, keys: list[str], out: Path, seconds: float) -> None:
    """Points run, resumed and failed; the best point by MAIN_METRIC; where the results are."""
    from rich.table import Table
    from rich.text import Text

    from kvsim.cli.output import console

    counts = df.attrs.get("sweep", {})
    failed = df[df.status != "ok"]
    t = Table(title="sweep", show_header=False)
    t.add_column("", justify="left")
    t.add_column("", justify="left")
    row = (lambda *cells: t.add_row(*map(Text, cells)))       # values shown as they are, never as markup
    shared = f"{counts['shared']} shared (the same run earlier in this process), " if counts.get("shared") else ""
    row("points", f"{len(df)} ({counts.get('run', len(df))} run, {shared}{counts.get('resumed', 0)} resumed, "
              f"{len(failed)} failed) in {seconds:.1f} s")
    ok = df[(df.status == "ok")]
    if MAIN_METRIC in ok and ok[MAIN_METRIC].notna().any():
        best = ok.loc[ok[MAIN_METRIC].astype(float).idxmin()]
        where = ", ".join(f"{k}={best[k]}" for k in keys)
        row("best (lowest normalized latency)",
                  f"{where}: {best[MAIN_METRIC]:.4g} s/token, {best['throughput_rps']:.3g} req/s")
    row("results", f"{out}/results.parquet, results.csv (rows as they finished: rows.jsonl)")
    console.print(t)
    # the line scripts grep for, kept from before the table
    typer.echo(f"wrote {out}/results.parquet and results.csv: {len(df)} runs, {len(failed)} failed, "
               f"{seconds:.1f} s")
    for row in failed.head(5).itertuples():
        typer.echo(f"  failed {row.run_id}: {row.error}", err=True)
