"""Progress of a long command as plain lines on stderr, for any stream (a log file, CI, a pipe): what is
being done, how many of how many, the seconds so far and a rough estimate of what is left.

`Lines(label, total)` prints at most one line every `EVERY_S` seconds (and the last one), so a command
of thousands of quick runs does not flood its log; `say(text)` prints a one-off line at once. The
sweep's rich bar (a terminal) and these lines (anything else) report the same counts.
"""

from __future__ import annotations

import sys
import time

#: Fewest seconds between two progress lines of one `Lines` (the first and last always print).
EVERY_S = 10.0


def say(text: str) -> None:
    """One line on stderr, now."""
    print(text, file=sys.stderr, flush=True)


class Lines:
    """`label: k of N <unit> done, S s so far, about L s left` on stderr as runs finish (`advance`)."""

    def __init__(self, label: str, total: int, unit: str = "runs", every_s: float = EVERY_S):
        self.label, self.total, self.unit, self.every_s = label, int(total), unit, every_s
        self.done, self.start, self.last = 0, time.perf_counter(), -float("inf")
        self.task_ids = [0]               # (the rich bar's interface, so callers treat both alike)

    def advance(self, _task: int = 0, n: int = 1, what: str = "") -> None:
        """Count `n` more done (`what`: the one just finished, shown in the line)."""
        self.done += n
        now = time.perf_counter()
        if now - self.last < self.every_s and self.done < self.total:
            return
        self.last, spent = now, now - self.start
        left = spent / self.done * (self.total - self.done) if self.done else float("nan")
        say(f"{self.label}: {self.done} of {self.total} {self.unit} done{f' ({what})' if what else ''}, "
            f"{spent:.0f} s so far" + (f", about {left:.0f} s left" if self.done < self.total else ""))

    def stop(self) -> None:
        """(The rich bar's interface; nothing to close.)"""
