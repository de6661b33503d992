"""Sub-commands loaded on first use, so `kvsim --help` and `kvsim run` do not build every command.

typer turns each registered command into a click command when the program starts, reading every
parameter's annotation; for ten commands that costs more than the rest of `kvsim --help`. The commands in
`LAZY` are not registered with typer: `LazyGroup` lists them, shows their one-line help from the table,
and imports and converts one only when it is run or asked for its own help. `tests/cli/test_imports.py`
checks that each table line matches the command it stands for.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from kvsim.cli.errors import KvsimGroup


@dataclass(frozen=True)
class LazyCommand:
    """Where a command lives (`module:attribute`: a typer app, or a command function) and the first
    paragraph of its help, which `kvsim --help` shortens to one line."""
    target: str
    summary: str


#: name -> command, in the order `kvsim --help` lists them around the eager `run` and `compare`.
LAZY: dict[str, LazyCommand] = {
    "calibrate-engine": LazyCommand(
        "kvsim.cli.commands.calibrate:calibrate_engine",
        "Fit CPU seconds per step = fixed + per-sequence x batch size to measured step times."),
    "validate": LazyCommand(
        "kvsim.cli.commands.validate:validate_cmd",
        "Replay measured vLLM runs through kvsim with the server's flags: per run and metric the measured "
        "value, the prediction and the absolute percentage error (%), with medians over runs."),
    "calibrate": LazyCommand(
        "kvsim.cli.commands.validate:calibrate_cmd",
        "Fit CPU time per step and per sequence, GPU kernel-time scale, all-reduce latency and the client "
        "path to measured runs; write an engine profile and report the leave-one-out error."),
    "sim-to-real": LazyCommand(
        "kvsim.cli.commands.validate:sim_to_real_cmd",
        "The sim-to-real report: per run measured, predicted with the default profile and after "
        "leave-one-out calibration, errors, medians, published simulators beside kvsim, figures."),
    "capacity": LazyCommand(
        "kvsim.cli.commands.plan:capacity",
        "How much fits: KV cache size (tokens, blocks) and concurrency per allocator; with --slo the highest "
        "rate (req/s) meeting it, its latency-against-rate curve and what limits it; with --gpus-for the GPUs."),
    "sweep": LazyCommand(
        "kvsim.cli.commands.sweep:sweep",
        "Run a grid of configurations on TRACE or a --preset: one row per run (every config field and "
        "summary metric; failed runs with their error) in Parquet and CSV, written as runs finish."),
    "tune-block-size": LazyCommand(
        "kvsim.cli.commands.report:tune_block_size_cmd",
        "Recommend a paged block size (tokens) for a workload: waste and capacity (tokens/s) against the "
        "paged kernel's gather cost and block bookkeeping (% of a step), one row per block size."),
    "report": LazyCommand(
        "kvsim.cli.commands.report:report_cmd",
        "A capacity-planning report (Markdown + self-contained HTML with figures): the memory breakdown per "
        "allocator, batch size and KV usage over time, latency against rate, waste and throughput against "
        "block size, and preemptions; from a trace and deployment, or from a sweep table."),
    "paper": LazyCommand(
        "kvsim.cli.commands.studies:paper_cmd",
        "The vLLM paper's experiments (OPT-13B/66B/175B, ShareGPT- and Alpaca-like): latency against rate "
        "per system, memory breakdown, batched requests, block size, recompute against swap; our numbers beside "
        "the published ones."),
    "hybrid-study": LazyCommand(
        "kvsim.cli.commands.studies:hybrid_study_cmd",
        "Hybrid models (gpt-oss, Gemma 3, Llama 4) under uniform pages, vLLM's hybrid KV cache manager and "
        "contiguous reservations: start-up figures, simulated batch and KV per request; Jenga's published "
        "figures beside ours."),
    "trace": LazyCommand(
        "kvsim.cli.commands.trace:trace_app",
        "Make, convert and describe request traces (JSONL, one request per line)."),
    "harness": LazyCommand(
        "gpu_harness.cli:harness_app",
        "Triton KV-cache kernels on a GPU (or the CPU interpreter): correctness check and cost calibration. "
        "Needs the gpu extra."),
}

#: Lazy commands listed after the eager ones; the others come before them.
_LAST = ("trace", "harness")


def load(name: str):
    """The click command for a `LAZY` entry: imports its module and converts it with typer under a
    parent app with the root's settings (plain help, no completion), as if registered on the root."""
    module, attr = LAZY[name].target.split(":")
    obj = getattr(importlib.import_module(module), attr)
    parent = typer.Typer(add_completion=False, rich_markup_mode=None)
    if isinstance(obj, typer.Typer):
        parent.add_typer(obj, name=name)
    else:   # commands that simulate or size take a pasted vLLM command line (kvsim.cli.vllm_args)
        from kvsim.cli.vllm_args import VllmCommand
        parent.command(name, cls=VllmCommand if getattr(obj, "accepts_vllm_flags", False) else None)(obj)
    command = typer.main.get_command(parent)
    return command.commands[name] if isinstance(command, TyperGroup) else command


class LazyGroup(TyperGroup):
    """A typer group that also offers the `LAZY` commands, loading each on first use."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._loaded: dict = {}
        self._listing = False

    def list_commands(self, ctx) -> list[str]:
        eager = [n for n in super().list_commands(ctx) if n not in LAZY]
        return [n for n in LAZY if n not in _LAST] + eager + list(_LAST)

    def get_command(self, ctx, cmd_name: str):
        if cmd_name not in LAZY:
            return super().get_command(ctx, cmd_name)
        if cmd_name in self._loaded:
            return self._loaded[cmd_name]
        if self._listing:   # only its one-line help is needed: a stand-in, not the command
            return TyperCommand(cmd_name, help=LAZY[cmd_name].summary)
        self._loaded[cmd_name] = load(cmd_name)
        return self._loaded[cmd_name]

    def format_commands(self, ctx, formatter) -> None:
        """The command list of `kvsim --help`, without loading the lazy commands."""
        self._listing = True
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False


class RootGroup(LazyGroup, KvsimGroup):
    """The root `kvsim` group: lazy commands, and the one error policy of `kvsim.cli.errors`."""
