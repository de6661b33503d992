"""The `kvsim` console script's entry point: Ctrl-C while the program is still loading ends it quietly.

Loading typer, rich and the command modules takes a good part of a second; a Ctrl-C in that time would
raise KeyboardInterrupt inside some import and print a Python traceback. `main` first sets a SIGINT
handler that ends the process at once (exit status 130, the shell's code for SIGINT, and one line
on stderr; nothing has been written yet, so there is nothing to clean up), imports the app, puts
Python's own handler back, so that a Ctrl-C once a command runs goes through the commands' clean-up
(kvsim.files: outputs whole or not at all), and turns a KeyboardInterrupt that still reaches it (while
click builds the command line) into the same one line. This module imports nothing heavy itself.

A Ctrl-C before the interpreter has reached this module (Python's own start-up, `site`) is Python's.
"""

from __future__ import annotations

import os
import signal
import sys

#: Exit status after Ctrl-C (128 + SIGINT), what a shell reports for a process SIGINT ended.
INTERRUPTED = 128 + signal.SIGINT
_MESSAGE = b"\nkvsim: interrupted while starting\n"


def _interrupted_while_loading(signum, frame) -> None:  # pragma: no cover - runs in a subprocess
    os.write(2, _MESSAGE)
    os._exit(INTERRUPTED)


def main() -> int | None:
    """Run the `kvsim` command line (`kvsim.cli.app:app`) with the start-up SIGINT guard."""
    previous = signal.signal(signal.SIGINT, _interrupted_while_loading)
    try:
        from kvsim.cli.app import app
    finally:
        signal.signal(signal.SIGINT, previous)
    try:
        return app()
    except KeyboardInterrupt:
        os.write(2, _MESSAGE.replace(b" while starting", b""))
        return INTERRUPTED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
