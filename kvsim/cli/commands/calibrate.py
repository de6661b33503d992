"""`kvsim calibrate-engine`: fit an engine profile's CPU constants to measured step times."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer


PROFILE_NAMES = ("vllm-2023", "vllm-v1", "ideal")


def calibrate_engine(
        ctx: typer.Context,
        csv_path: Path = typer.Argument(..., help="CSV of batch_size and cpu_ms, or batch_size, step_ms "
                                        "and context_tokens (docs/engine-profiles.md)."),
        out: Path = typer.Option(..., "--out", "-o", help="Profile JSON to write (use with --engine-profile)."),
        base: str = typer.Option("vllm-2023", "--base", help="Profile whose policy the fitted one keeps: "
                                 + ", ".join(PROFILE_NAMES) + "."),
        model: str = typer.Option("opt-13b", "--model", help="Model the step_ms rows were measured on."),
        gpu: str = typer.Option("a100-40gb", "--gpu", help="GPU the step_ms rows were measured on."),
        tp: int = typer.Option(1, "--tp", "--tensor-parallel-size", min=1, help="Tensor-parallel degree."),
        block_size: int = typer.Option(16, "--block-size", min=1, help="Paged block size, tokens."),
        calibration: Optional[Path] = typer.Option(None, "--calibration", help="Kernel calibration JSON "
                                                   "for the step_ms subtraction.")) -> None:
    """Fit CPU seconds per step = fixed + per-sequence x batch size to measured step times."""
    from kvsim.cost.profile_fit import fit_cpu, read_cpu_times, write_profile
    from kvsim.cli.output import console, error
    from kvsim.cost.profiles import PROFILES

    try:
        from kvsim.files import check_output_file
        check_output_file(out, "-o")
        if base not in PROFILES:
            raise ValueError(f"--base: unknown profile {base!r}; known: {', '.join(PROFILES)}")
        from kvsim.specs import get_gpu, get_model
        get_model(model), get_gpu(gpu)                  # a typo fails now, not after reading the rows
        used = []

        def kernel_seconds(batch: int, context: float) -> float:
            used.append(batch)
            from dataclasses import replace
            from kvsim.cost.calibration import load_calibration
            from kvsim.cost.select import cost_model        # the base's kernels (vllm-v1: its time model);
            from kvsim.specs import Deployment, get_gpu, get_model
            cal = load_calibration(calibration) if calibration else None
            base_kernels = replace(PROFILES[base], overlap_cpu_step_s=0.0, overlap_cpu_seq_s=0.0,
                                   kernel_step_overhead=False)      # the rest is CPU not overlapped
            cost = cost_model(Deployment(get_model(model), get_gpu(gpu), tp), block_size,
                              PROFILES[base].paged_penalty or cal is not None, cal, base_kernels, max(batch, 256))
            return cost.step_time(0, 0, batch, round(batch * context))

        batches, cpu_s = read_cpu_times(csv_path, kernel_seconds)
        _check_applies(ctx, csv_path, bool(used))
        fit = fit_cpu(batches, cpu_s)
        check_fit(csv_path, fit, cpu_s)
        write_profile(out, base, fit, str(csv_path), "-o")
    except (ValueError, OSError) as exc:
        error(str(exc))
    console.print(f"{out}: base {base}, cpu_step_s = {fit.cpu_step_s * 1e3:.3f} ms, cpu_seq_s = "
                  f"{fit.cpu_seq_s * 1e6:.1f} us per sequence (rms error {fit.rms_error_s * 1e3:.3f} ms "
                  f"over {fit.rows} rows)", highlight=False)


def check_fit(csv_path: Path, fit, cpu_s) -> None:
    """Refuse a fit whose rms error exceeds the spread (standard deviation) of the CPU times it fits: a
    constant (their mean) would fit better, so the rows do not follow fixed + per-sequence x batch (often
    step_ms rows below the simulated kernel time, which leave negative CPU times)."""
    import numpy as np
    spread = float(np.std(cpu_s))
    if fit.rms_error_s > spread * (1 + 1e-9) + 1e-12:
        below = int(np.sum(cpu_s < 0))
        raise ValueError(f"{csv_path}: the fit's rms error {fit.rms_error_s * 1e3:.4g} ms exceeds the spread of "
                         f"the CPU times it fits ({spread * 1e3:.4g} ms): the rows do not follow fixed + "
                         f"per-sequence x batch size" + (f"; {below} row(s) measured less than the simulated "
                                                         f"kernel time" if below else ""))


#: Flags that only size the kernel time subtracted from step_ms rows.
_KERNEL_FLAGS = {"model": "--model", "gpu": "--gpu", "tp": "--tp", "block_size": "--block-size",
                 "calibration": "--calibration"}


def _check_applies(ctx: typer.Context, csv_path: Path, kernel_time_used: bool) -> None:
    """A kernel flag given on the command line for a cpu_ms file (no kernel time to subtract) is refused:
    it would be ignored without a word."""
    if kernel_time_used:
        return
    given = [flag for name, flag in _KERNEL_FLAGS.items()
             if getattr(ctx.get_parameter_source(name), "name", "") == "COMMANDLINE"]
    if given:
        raise ValueError(f"{', '.join(given)}: does not apply to {csv_path}, whose cpu_ms rows are CPU times "
                         "already (these flags size the kernel time subtracted from step_ms rows)")
