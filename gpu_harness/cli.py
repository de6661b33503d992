"""`kvsim harness ...` commands (typer app `harness_app`; also `python -m gpu_harness ...`).

torch and triton are imported inside the commands only, so the main `kvsim` app loads without them;
a missing torch/triton prints install instructions and exits with status 2.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

harness_app = typer.Typer(help="Triton KV-cache kernels on a GPU (or the CPU interpreter): "
                               "correctness check and cost calibration. Needs the gpu extra.",
                          no_args_is_help=True)
console = Console()


def _backend():
    from gpu_harness.backend import HarnessUnavailable, get_backend
    try:
        return get_backend()
    except HarnessUnavailable as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


@harness_app.command()
def check(full: bool = typer.Option(False, "--full", help="Real-shape grid (contexts up to 4097 tokens, "
                                    "a >2**31-element cache); meant for a GPU."),
          seed: int = typer.Option(0, help="Random seed for inputs.")) -> None:
    """Compare every kernel with its torch reference; print the worst absolute error per case.

    Exit status 1 if any case is out of tolerance, 2 if torch/triton is missing.
    """
    backend = _backend()
    from gpu_harness.check import run_check
    rows = run_check(full=full, seed=seed)
    table = Table(title=f"kernel check on {backend.name} ({backend.kind})")
    for col in ("case", "worst abs err", "atol", "rtol", "ok"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.case, f"{r.max_abs_err:.3g}", f"{r.atol:g}", f"{r.rtol:g}",
                      "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
    console.print(table)
    failed = sum(not r.passed for r in rows)
    console.print(f"{len(rows) - failed}/{len(rows)} cases passed")
    if failed:
        raise typer.Exit(1)


@harness_app.command()
def calibrate(out: Path = typer.Option(Path("calibration.json"), "--out", help="JSON file to write "
                                       "(format kvsim-calibration/1)."),
              gpu: str = typer.Option(None, "--gpu", help="kvsim GPU preset for the datasheet HBM "
                                      "bandwidth (default: guessed from the device name)."),
              quick: bool = typer.Option(False, "--quick", help="Smaller GPU grid (about a minute)."),
              seed: int = typer.Option(0, help="Random seed for block tables and inputs.")) -> None:
    """Time paged/contiguous decode and store_kv, fit the cost model, write the calibration JSON.

    Bandwidths are decimal GB/s (1e9 bytes/s). On the CPU interpreter the grid is tiny and the file is
    marked usable_for_prediction: false.
    """
    from gpu_harness import bench
    from kvsim.specs import get_gpu
    if gpu is not None:
        try:
            get_gpu(gpu)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    backend = _backend()
    from gpu_harness.calibrate import calibrate as run_calibration
    preset = gpu if gpu is not None else (None if backend.interpret else bench.guess_gpu_preset(backend.name))
    doc = run_calibration(backend, preset, quick=quick, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    _print_summary(doc, preset)
    console.print(f"wrote {out}")


def _print_summary(doc: dict, preset: str | None) -> None:
    peak, copy = doc["hbm"]["datasheet_bytes_per_s"], doc["hbm"]["copy_bytes_per_s"]
    table = Table(title=f"calibration on {doc['device']} ({doc['backend']}); copy {copy / 1e9:.0f} GB/s, "
                        f"datasheet {'-' if peak is None else f'{peak / 1e9:.0f} GB/s ({preset})'}")
    for col in ("kernel", "bs", "table", "batch", "context", "splits", "median us", "GB/s", "% datasheet",
                "% copy"):
        table.add_column(col, justify="right")
    for m in doc["measurements"]:
        bw = m["bytes_per_s"]
        table.add_row(m["kernel"], str(m["block_size"] or "-"), m["table"] or "-", str(m["batch"]),
                      str(m["context"] or "-"), str(m["splits"] or "-"), f"{m['median_s'] * 1e6:.1f}",
                      f"{bw / 1e9:.1f}", "-" if peak is None else f"{100 * bw / peak:.1f}",
                      f"{100 * bw / copy:.1f}")
    console.print(table)
    console.print_json(data=doc["fit"])
