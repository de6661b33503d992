"""`kvsim harness ...` commands (typer app `harness_app`; also `python -m gpu_harness ...`).

torch and triton are imported inside the commands only, so the main `kvsim` app loads without them;
a missing torch/triton prints install instructions and exits with status 2.
"""

from __future__ import annotations

import functools
import json
from dataclasses import asdict
from pathlib import Path

from typing import Optional

import typer

from kvsim.cli.errors import KvsimGroup
from kvsim.files import check_output_file, write_text_atomic

harness_app = typer.Typer(cls=KvsimGroup, help="Triton KV-cache kernels on a GPU (or the CPU interpreter): "
                               "correctness check and cost calibration. Needs the gpu extra.",
                          no_args_is_help=True)


@functools.cache
def _console():
    """rich's Console, made on first use (so `kvsim --help` does not load rich)."""
    from rich.console import Console

    return Console()


def Table(*args, **kwargs):
    """rich's Table, imported on first use."""
    from rich.table import Table as RichTable

    return RichTable(*args, **kwargs)


def _backend():
    from gpu_harness.backend import HarnessUnavailable, get_backend
    try:
        return get_backend()
    except HarnessUnavailable as exc:
        _console().print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


GRIDS = ("all", "base", "hybrid")


@harness_app.command()
def check(full: bool = typer.Option(False, "--full", help="Real-shape grid (contexts up to 8193 tokens, "
                                    "a >2**31-element cache); meant for a GPU."),
          grid: str = typer.Option("all", "--grid", help="Kernels to check: base (full-attention paged and "
                                   "contiguous decode, store_kv, copy_blocks), hybrid (sliding-window and "
                                   "MLA decode), or all."),
          seed: int = typer.Option(0, help="Random seed for inputs.")) -> None:
    """Compare every kernel with its torch reference; print the worst absolute error per case.

    Exit status 1 if any case is out of tolerance, 2 if torch/triton is missing or --grid is unknown.
    """
    if grid not in GRIDS:
        raise ValueError(f"--grid must be one of {', '.join(GRIDS)}, got {grid!r}")
    backend = _backend()
    from gpu_harness.check import run_check
    from gpu_harness.check_hybrid import run_hybrid_check
    rows = run_check(full=full, seed=seed) if grid in ("all", "base") else []
    rows += run_hybrid_check(full=full, seed=seed) if grid in ("all", "hybrid") else []
    table = Table(title=f"kernel check on {backend.name} ({backend.kind})")
    for col in ("case", "worst abs err", "atol", "rtol", "ok"):
        table.add_column(col)
    for r in rows:
        table.add_row(r.case, f"{r.max_abs_err:.3g}", f"{r.atol:g}", f"{r.rtol:g}",
                      "[green]pass[/green]" if r.passed else "[red]FAIL[/red]")
    _console().print(table)
    failed = sum(not r.passed for r in rows)
    _console().print(f"{len(rows) - failed}/{len(rows)} cases passed")
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
    out.parent.mkdir(parents=True, exist_ok=True)
    check_output_file(out, "--out")
    if gpu is not None:
        try:
            get_gpu(gpu)
        except ValueError as exc:
            _console().print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    backend = _backend()
    from gpu_harness.calibrate import calibrate as run_calibration
    preset = gpu if gpu is not None else (None if backend.interpret else bench.guess_gpu_preset(backend.name))
    doc = run_calibration(backend, preset, quick=quick, seed=seed)
    write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
    _print_summary(doc, preset)
    _console().print(f"wrote {out}")


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
    _console().print(table)
    _console().print_json(data=doc["fit"])


@harness_app.command("bench-hybrid")
def bench_hybrid(out: Path = typer.Option(None, "--out", help="JSON file for the measurements."),
                 seed: int = typer.Option(0, help="Random seed for block tables.")) -> None:
    """Time sliding-window and chunked-local decode (next to full attention) and MLA decode against
    their bytes model.

    Real shapes (gpt-oss-120b, gemma-3-27b, llama-4-scout, DeepSeek-V3) on a GPU, tiny ones on the
    interpreter; bandwidths are decimal GB/s of the bytes each kernel must read (a window: its tokens only).
    """
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        check_output_file(out, "--out")
    backend = _backend()
    from gpu_harness.bench_hybrid import run_hybrid_bench
    doc = run_hybrid_bench(backend, seed=seed)
    table = Table(title=f"hybrid decode kernels on {doc['device']} ({doc['backend']}, {doc['dtype']})")
    for col in ("kernel", "shape", "batch", "context", "window/chunk", "splits", "median us", "GB/s"):
        table.add_column(col, justify="right")
    for m in doc["measurements"]:
        span = f"W {m['window']}" if m["window"] else f"C {m['chunk']}" if m["chunk"] else "-"
        table.add_row(m["kernel"], m["shape"], str(m["batch"]), str(m["context"]), span,
                      str(m["splits"]), f"{m['median_s'] * 1e6:.1f}", f"{m['bytes_per_s'] / 1e9:.2f}")
    _console().print(table)
    if out is not None:
        write_text_atomic(out, json.dumps(doc, indent=2) + "\n")
        _console().print(f"wrote {out}")


@harness_app.command()
def replay(trace: Path = typer.Argument(..., help="Trace file (any format kvsim reads)."),
           model: str = typer.Option("opt-13b", "--model", help="Model preset (real shape on a GPU)."),
           gpu: str = typer.Option("a100-40gb", "--gpu", help="GPU preset (capacity and cost model)."),
           tp: int = typer.Option(1, "--tp", min=1, help="Tensor-parallel degree; the pool is one GPU's."),
           kv_gib: float = typer.Option(None, "--kv-gib", help="KV memory of the deployment, GiB."),
           num_blocks: int = typer.Option(None, "--num-blocks", help="KV blocks of the deployment."),
           block_size: int = typer.Option(16, "--block-size", min=1, help="Block size, tokens."),
           max_num_seqs: Optional[int] = typer.Option(None, "--max-num-seqs", min=1, help="Most sequences "
                                                      "per batch (default: the engine profile's, as kvsim run)."),
           preemption: str = typer.Option("recompute", "--preemption", help="recompute or swap."),
           prefix_caching: Optional[bool] = typer.Option(
               None, "--enable-prefix-caching/--no-enable-prefix-caching", "--prefix-caching/--no-prefix-caching",
               help="vLLM's automatic prefix caching (default: the engine profile's, as `kvsim run`)."),
           engine_profile: str = typer.Option("vllm-v1", "--engine-profile", help="Engine profile, as for "
                                              "`kvsim run` (its policy decides the blocks held)."),
           max_requests: int = typer.Option(None, "--max-requests", min=1, help="Replay the first N "
                                            "requests (default: 12 on the CPU interpreter, all on a GPU)."),
           layers: int = typer.Option(2, "--layers", min=1, help="Layers with a real pool (GPU only; the "
                                      "interpreter uses one tiny layer)."),
           check_every: int = typer.Option(1, "--check-every", min=1, help="Compare decode outputs with "
                                           "the reference every N steps."),
           expect: Path = typer.Option(None, "--expect", help="steps.csv of `kvsim run --out` for the same "
                                       "trace and flags (default: run kvsim now, which needs simpy)."),
           json_out: Path = typer.Option(None, "--json", help="Write the report as JSON here."),
           seed: int = typer.Option(0, "--seed", help="Random seed for K, V and queries.")) -> None:
    """Replay TRACE on a real KV pool driven by kvsim's scheduler and paged allocator (the hybrid one,
    one block table per KV cache group, for sliding-window, chunked or Mamba layers): store_kv for
    every new token, paged_decode for every decoding sequence (and group), outputs checked against a contiguous
    reference (proves kernels reading kvsim's block tables see the right K/V: no aliasing, correct
    copy-on-write), and a pool audit at every step: every written token read back through its table,
    the distinct blocks the live tables reach counted and compared with kvsim's allocator counters and
    with the prediction (--expect, or a kvsim run now).

    Exit status 1 on a mismatch or an error above tolerance, 2 on bad input or a missing extra.
    """
    backend = _backend()
    import torch

    from gpu_harness.replay import TINY, ReplayShape, replay as run_replay
    from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
    from kvsim.specs import Deployment, get_gpu, get_model
    from kvsim.trace.formats import load_trace
    try:
        if json_out is not None:
            check_output_file(json_out, "--json")
        dep = Deployment(get_model(model), get_gpu(gpu), tp)
        cfg = SimConfig(dep, CacheConfig(block_size=block_size, kv_gib=kv_gib, num_blocks=num_blocks,
                                         prefix_caching=prefix_caching),
                        SchedulerConfig(max_num_seqs=max_num_seqs, preemption=preemption),
                        engine_profile=engine_profile)
        cfg.resolved()
        tr = load_trace(trace)
        limit = max_requests or (12 if backend.interpret else len(tr))
        tr = tr.head(min(limit, len(tr)))
        predicted = _predicted_blocks(tr, cfg, expect)
    except ValueError as exc:
        _console().print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    if backend.interpret:
        shape, tolerance = TINY, 1e-4
    else:
        shape, tolerance = ReplayShape.of_model(dep.model, tp, layers, torch.bfloat16), 3e-2
    report = run_replay(tr, cfg, shape, backend.device, predicted, check_every, seed, tolerance)
    table = Table(title=f"replay of {trace.name} ({len(tr)} requests) on {backend.name}: {model}, "
                        f"{shape.num_layers} layer(s) of {shape.q_heads}/{shape.kv_heads} heads x {shape.head_dim}")
    table.add_column("measure")
    table.add_column("value", justify="right")
    for name, value in (("engine steps", report.steps), ("steps checked", report.checked_steps),
                        ("tokens written (store_kv)", report.tokens_written),
                        ("copy-on-write blocks", report.block_copies), ("preemptions", report.preemptions),
                        ("most blocks held (pool audit)", report.max_held_blocks),
                        ("token readbacks (pool audit)", report.verified_tokens),
                        ("worst |paged - reference|", f"{report.worst_abs_err:.3g} (tolerance {tolerance:g})"),
                        ("KV cache groups", "; ".join(report.groups)),
                        ("pool audit vs kvsim", report.first_mismatch or "equal at every step"),
                        ("wall time", f"{report.wall_s:.1f} s")):
        table.add_row(name, str(value))
    _console().print(table)
    if json_out is not None:
        write_text_atomic(json_out, json.dumps({**asdict(report), "ok": report.ok}, indent=2))
    if not report.ok:
        raise typer.Exit(1)


def _predicted_blocks(trace, cfg, expect: Path | None) -> list[int]:
    """kvsim's used-block count per step: from a steps.csv, or from running the simulator now."""
    if expect is not None:
        import csv
        try:
            with expect.open() as f:
                return [int(row["used_blocks"]) for row in csv.DictReader(f)]
        except (OSError, KeyError, ValueError) as exc:
            raise ValueError(f"{expect}: cannot read used_blocks from it ({exc})") from None
    try:
        from kvsim.engine.sim import simulate
    except ImportError as exc:
        raise ValueError(f"cannot run the simulator here ({exc}); pass --expect with the steps.csv "
                         "of `kvsim run --out` for the same trace and flags") from None
    return simulate(trace, cfg).steps.used_blocks.tolist()


@harness_app.command()
def bookkeeping(out: Path = typer.Option(Path("bookkeeping.json"), "--out", help="JSON file to write "
                                         "(format kvsim-bookkeeping/1).")) -> None:
    """Time block-table building and copying and block allocation on this machine (seconds per entry,
    per copy, per block) for `kvsim tune-block-size --bookkeeping`."""
    check_output_file(out, "--out")               # before the timing, not after
    backend = _backend()
    from gpu_harness.bookkeeping import time_bookkeeping
    bk = time_bookkeeping(backend.device)
    write_text_atomic(out, bk.to_json() + "\n", "--out")
    _console().print(f"entry {bk.entry_s * 1e9:.1f} ns, copy {bk.copy_fixed_s * 1e6:.1f} us + "
                  f"{bk.copy_bytes_per_s / 1e9:.2f} GB/s, block alloc/free {bk.alloc_free_s * 1e9:.0f} ns "
                  f"-> {out}")
