"""`python -m kvsim ...`: the `kvsim` command line (kvsim.cli.entry.main, with its start-up Ctrl-C guard)."""

import sys

from kvsim.cli.entry import main

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
