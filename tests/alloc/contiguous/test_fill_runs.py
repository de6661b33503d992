"""`FillRun` (kvsim/alloc/contiguous/fill_runs.py), a contiguous window's snapshots kept as its last snapshot and the
slots each step writes: its rows by hand, read one by one and as the step log's numpy table, and the
step log folding such runs between tuples and the paged allocator's `TickRun`s."""

import numpy as np
import pytest

from kvsim.alloc.base import MemoryStats
from kvsim.alloc.contiguous.fill_runs import FillRun
from kvsim.alloc.paged.tick_runs import TickRun
from kvsim.engine import metrics
from kvsim.engine.metrics import StepLog
from kvsim.engine.step import StepPlan

LAST = MemoryStats(100, 30, 20, 5, 5, 40, 60, 40, 60, 0)


def test_a_fill_run_reads_as_its_snapshots_by_hand():
    """3 steps writing 2 slots each, ending at 30 written and 20 reserved: 26/24, 28/22, 30/20."""
    run = FillRun(LAST, 3, 2)
    rows = [LAST._replace(token_states=t, reserved=r) for t, r in ((26, 24), (28, 22), (30, 20))]
    assert len(run) == 3 and list(run) == rows and run == rows and run != rows[:2]
    assert run[-1] == LAST and run[0] == rows[0] and run[-3] == rows[0] and run[1:] == rows[1:]
    assert FillRun(LAST, 2, 0) == [LAST, LAST]
    with pytest.raises(IndexError):
        run[3]
    assert list(FillRun(LAST, 0, 2)) == []
    with pytest.raises(ValueError, match="grow >= 0"):
        FillRun(LAST, 2, -1)


def test_runs_table_of_several_fill_runs_by_hand():
    """A: the run above; B: 1 step of 5 slots (just its last); C: 2 steps writing nothing."""
    b_last = MemoryStats(8, 3, 2, 1, 0, 2, 6, 2, 6, 0)
    c_last = MemoryStats(8, 1, 0, 1, 0, 6, 2, 6, 2, 1)
    runs = [FillRun(LAST, 3, 2), FillRun(b_last, 1, 5), FillRun(c_last, 2, 0)]
    table = FillRun.runs_table(runs)
    assert table.dtype == np.int64
    assert FillRun.concat(runs) == list(runs[0]) + [b_last, c_last, c_last]    # (one `MemoryTable`)
    assert table.tolist() == [[100, 26, 24, 5, 5, 40, 60, 40, 60, 0], [100, 28, 22, 5, 5, 40, 60, 40, 60, 0],
                              [100, 30, 20, 5, 5, 40, 60, 40, 60, 0], list(b_last), list(c_last), list(c_last)]


def mem(tokens, reserved, internal, free, used, unshared):
    """A 20-slot cache in 5 blocks of 4 (as tests/engine/test_step_log_by_hand.py)."""
    return MemoryStats(20, tokens, reserved, internal, 0, free, used, 5 - used, unshared)


@pytest.mark.parametrize("chunk", [3, 1 << 16])
def test_the_step_log_folds_fill_runs_between_rows_and_tick_runs(monkeypatch, chunk):
    """One step; a fill run of 2 steps (1 slot each, to 11 written); the paged `TickRun` of
    tests/engine/test_step_log_by_hand.py (2 steps: 4 then 5 written, a block taken at the second); a fill
    run of 3 steps (2 slots each, to 9 written and 1 reserved). Each kind is expanded on its own."""
    monkeypatch.setattr(metrics, "CHUNK", chunk)
    log = StepLog()
    plans = [
        StepPlan(prefill_tokens=8, batch_requests=2, starts=[0.0], durations=[1.0], waiting=[0],
                 memory=[mem(8, 3, 1, 8, 3, 4)]),
        StepPlan(decode_seqs=1, batch_requests=2, starts=[1.0, 1.5], durations=[0.5, 0.5], waiting=[0, 0],
                 memory=FillRun(mem(11, 0, 1, 8, 3, 4), 2, 1)),
        StepPlan(decode_seqs=1, batch_requests=1, starts=[2.0, 3.0], durations=[1.0, 0.25], waiting=[0, 0],
                 memory=TickRun(2, [(1, 1, 4, 0)], 20, 4, 5, 3, 1, 4, 1, 4, 0)),
        StepPlan(decode_seqs=2, batch_requests=2, starts=[3.25, 3.75, 4.25], durations=[0.5] * 3, waiting=[0] * 3,
                 memory=FillRun(mem(9, 1, 2, 8, 3, 3), 3, 2)),
    ]
    for plan in plans:
        log.record(plan)
    cols = log.columns()
    assert cols["token_states"].tolist() == [8, 10, 11, 4, 5, 5, 7, 9]
    assert cols["reserved"].tolist() == [3, 1, 0, 0, 3, 5, 3, 1]
    assert cols["internal_fragmentation"].tolist() == [1, 1, 1, 0, 0, 2, 2, 2]
    assert cols["free"].tolist() == [8, 8, 8, 16, 12, 8, 8, 8]
    assert cols["used_blocks"].tolist() == [3, 3, 3, 1, 2, 3, 3, 3]
    assert cols["unshared_blocks"].tolist() == [4, 4, 4, 1, 2, 3, 3, 3]
    assert cols["decode_tokens"].tolist() == [0, 1, 1, 1, 1, 2, 2, 2]
    assert cols["time_s"].tolist() == [0.0, 1.0, 1.5, 2.0, 3.0, 3.25, 3.75, 4.25]
