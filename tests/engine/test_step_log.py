"""The step log: rows folded into aggregates in fixed chunks (the same sums however steps were
recorded), no rows kept unless asked, and steps.csv streamed as pandas would write it."""

import numpy as np
import pandas as pd
import pytest

from kvsim.engine import metrics
from kvsim.engine.config import CacheConfig, SimConfig
from kvsim.cli.output import StepsCsv
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.synthetic import generate

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


@pytest.fixture(scope="module")
def trace():
    return generate("sharegpt", rate_rps=2.0, duration_s=60, seed=1)


def test_chunked_aggregates_equal_the_whole_columns(trace, monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK", 37)             # many chunks, windows split across them
    cfg = SimConfig(DEP, CacheConfig(kv_gib=2))
    res = simulate(trace, cfg)
    steps = res.step_columns
    w = steps["duration_s"]
    assert res.summary["engine_steps"] == len(w) > 5 * 37
    for name in metrics.CATEGORIES:
        expected = (steps[name] * w).sum() / w.sum() / res.summary["kv"]["capacity_tokens"]
        assert res.summary["kv"]["mean_fraction"][name] == pytest.approx(expected, rel=1e-12)
    assert res.summary["max_batch_size"] == steps["running"].max()
    assert res.summary["duration_s"] == steps["time_s"][-1] + w[-1]
    assert list(steps["step"]) == list(range(len(w)))
    single = simulate(trace, cfg, fast_forward=False)      # one row at a time: the same sums
    assert single.summary["kv"] == res.summary["kv"]


def test_no_rows_kept_unless_asked(trace):
    res = simulate(trace, SimConfig(DEP, CacheConfig(kv_gib=2)), keep_steps=False)
    assert res.summary["engine_steps"] > 0
    with pytest.raises(ValueError, match="kept no rows"):
        res.steps


def test_streamed_steps_csv_is_what_pandas_writes(trace, tmp_path, monkeypatch):
    monkeypatch.setattr(metrics, "CHUNK", 50)
    cfg = SimConfig(DEP, CacheConfig(kv_gib=2))
    sink = StepsCsv(tmp_path / "steps.csv")
    simulate(trace, cfg, keep_steps=False, step_sink=sink)
    assert not (tmp_path / "steps.csv").exists()          # only the temporary file so far
    sink.commit()
    kept = simulate(trace, cfg).steps
    kept.to_csv(tmp_path / "pandas.csv", index=False)
    assert (tmp_path / "steps.csv").read_text() == (tmp_path / "pandas.csv").read_text()
    assert list(pd.read_csv(tmp_path / "steps.csv").columns) == list(metrics.STEP_COLUMNS)
    assert np.array_equal(pd.read_csv(tmp_path / "steps.csv").used_blocks, kept.used_blocks)
