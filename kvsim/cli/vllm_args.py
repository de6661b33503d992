"""A pasted vLLM command line on every command that simulates or sizes (`run`, `compare`, `capacity`,
`tune-block-size`, `report`): the vLLM flags of `kvsim.planning.vllm_flags` that a command does not
declare itself are taken out before click parses the rest, turned into run flags, and applied to the
run's configuration; those that change no prediction (`--port`, `--trust-remote-code`, ...) are listed
as ignored on stderr and in `--json`.

A command opts in with `cls=VllmCommand` (eager commands) or `accepts_vllm_flags = True` on its function
(lazy ones, `kvsim.cli.lazy.load`), and reads what was found with `vllm_extras()`.
"""

from __future__ import annotations

from typing import Any

import typer
from typer.core import TyperCommand

try:
    from typer._click.globals import get_current_context
except ImportError:  # pragma: no cover - older typer runs on click itself
    from click import get_current_context

_META = "kvsim.vllm_flags"


class VllmCommand(TyperCommand):
    """A typer command that also accepts every vLLM flag of `kvsim.planning.vllm_flags.VLLM_FLAGS`, and
    lists them at the end of its --help."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.epilog = ((self.epilog + "\n\n") if self.epilog else "") + vllm_epilog()

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        from kvsim.planning.vllm_flags import split_argv
        declared = {opt for p in self.params for opt in (*p.opts, *p.secondary_opts)}
        rest, flags, ignored = split_argv(list(args), declared)
        ctx.meta[_META] = (flags, ignored)
        return super().parse_args(ctx, rest)


def vllm_extras() -> tuple[dict[str, Any], list[str]]:
    """The run flags the running command's vLLM flags set, and the ignored vLLM flags ({} and [] when
    none, or outside a `VllmCommand`)."""
    ctx = get_current_context(silent=True)
    return ctx.meta.get(_META, ({}, [])) if ctx is not None else ({}, [])


def note_ignored(ignored: list[str]) -> None:
    """One line on stderr naming the vLLM flags accepted but ignored."""
    if ignored:
        typer.echo(f"note: vLLM flags accepted and ignored (no effect on the prediction): {', '.join(ignored)}",
                   err=True)


def vllm_epilog() -> str:
    """The --help paragraph naming the vLLM flags a command accepts: those that change the prediction
    (with the kvsim flag each sets) and those accepted and ignored."""
    from kvsim.planning.vllm_flags import VLLM_FLAGS
    used = ", ".join(("-" if len(n) == 1 else "--") + n
                     + (f" (= --{same})" if f.switch is None and (same := f.run_flag.replace("_", "-")) != n else "")
                     for n, f in VLLM_FLAGS.items() if f.run_flag)
    ignored = ", ".join(f"--{n}" for n, f in VLLM_FLAGS.items() if not f.run_flag)
    return ("vLLM flags accepted as `vllm serve` spells them (a pasted command line works; _ or - alike): "
            f"{used}. Accepted and ignored (no effect on the prediction): {ignored}.")
