"""How many examples the property tests run. Under mutation testing, bench/mutate.py sets
KVSIM_QUICK_EXAMPLES: each such test then runs that many examples, derandomized, so a mutant's verdict is
the same on every run and a surviving mutant does not pay for hundreds of examples."""

from __future__ import annotations

import os

QUICK = int(os.environ.get("KVSIM_QUICK_EXAMPLES", "0"))


def examples(default: int) -> dict:
    """`settings` keywords: `default` examples, or the quick count, derandomized, under mutation testing."""
    return {"max_examples": QUICK or default, "derandomize": bool(QUICK)}
