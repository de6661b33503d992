"""One error policy for every `kvsim` command, old and new: no input ends in a traceback.

`KvsimGroup` is the click group class of the root typer app (through `kvsim.cli.lazy.RootGroup`). Every
command and sub-command runs inside its `invoke`, so a command needs no try/except of its own:
- bad input (`ValueError`, which includes `TraceError` and JSON and Unicode errors, and `OSError`: a
  missing, unreadable or unwritable file) prints `error: <message>` on stderr and exits with status 2;
  the message names the file, line, field or flag (raise ValueError with such a message);
- anything else is a bug in kvsim: one line naming the exception and where it was raised, exit status 1;
- Ctrl-C ends the command with exit status 130 (output files are written whole or not at all, see
  kvsim.files, so an interrupted run leaves nothing that looks complete).
"""

from __future__ import annotations

import traceback

import typer
from typer.core import TyperGroup

#: How click and typer end a command on purpose (passed through untouched). Recent typer carries its own
#: copy of click, whose exceptions derive from typer's (importing click as well would only cost time).
try:
    import typer._click   # noqa: F401
    _CONTROL: tuple = (typer.Exit, typer.Abort, typer.TyperException)
except ImportError:  # pragma: no cover - older typer runs on click itself
    import click
    _CONTROL = (click.exceptions.Exit, click.ClickException, click.Abort, typer.Exit, typer.Abort)

#: What a user can cause with bad input; anything else reaching the top is a bug.
USER_ERRORS = (ValueError, OSError)


def describe(exc: BaseException) -> str:
    """A one-line message for a user error: OSError as `file: reason`, others as their text."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    text = str(exc) or type(exc).__name__
    return " ".join(text.split()) if "\n" in text else text


def _where(exc: BaseException) -> str:
    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def fail(message: str, code: int = 2) -> None:
    """Print `error: message` on stderr and exit with `code`."""
    from kvsim.cli.output import error   # rich is loaded only when there is something to print
    error(message, code)


class KvsimGroup(TyperGroup):
    """The root command group: runs the chosen command and turns its exceptions into one line."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except _CONTROL:
            raise
        except KeyboardInterrupt:        # Ctrl-C: one line, exit 130 (outputs are whole or absent)
            typer.echo("kvsim: interrupted", err=True)
            raise typer.Exit(130) from None
        except USER_ERRORS as exc:
            fail(describe(exc))
        except MemoryError:
            fail("out of memory (a smaller trace, --max-requests or fewer configurations may fit)")
        except Exception as exc:   # a bug: say so in one line instead of a traceback
            fail(f"internal error, please report it: {type(exc).__name__}: {describe(exc)}{_where(exc)}", 1)

