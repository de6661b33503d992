"""The replay on the interpreter: kvsim's scheduler and paged allocator drive real kernels on a real
pool; outputs match the contiguous reference and held blocks match the SimPy run's prediction."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from gpu_harness import replay as replay_mod
from gpu_harness.cli import harness_app
from gpu_harness.replay import TINY, replay
from kvsim.cli.app import app as kvsim_app
from kvsim.alloc.paged.allocator import PagedAllocator
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.trace.table import Trace
from kvsim.trace.formats import load_trace

ROOT = Path(__file__).resolve().parents[2]
TINY_TRACE = str(ROOT / "traces" / "tiny.jsonl")


def small_trace(n=None, prefix=False):
    rng = np.random.default_rng(0)
    num = 8
    return Trace.from_arrays(np.sort(rng.uniform(0, 0.1, num)), rng.integers(17, 30, num),
                             rng.integers(2, 9, num), n=n or 1,
                             prefix_group=["g"] * num if prefix else None,
                             prefix_tokens=[16] * num if prefix else None)


def config(num_blocks, preemption="recompute", prefix=False, async_scheduling=None):
    return SimConfig(Deployment(get_model("opt-13b"), get_gpu("a100-40gb")),
                     CacheConfig(block_size=8, num_blocks=num_blocks, prefix_caching=prefix),
                     SchedulerConfig(preemption=preemption, async_scheduling=async_scheduling))


def run(trace, cfg, **kw):
    predicted = simulate(trace, cfg).steps.used_blocks.tolist()
    return replay(trace, cfg, TINY, "cpu", predicted, **kw), predicted


def test_replay_matches_kvsim_with_plenty_of_memory():
    tr = small_trace(n=[1] * 6 + [2, 1])
    report, predicted = run(tr, config(200))
    assert report.ok, report
    assert report.steps == len(predicted) and report.checked_steps > 0
    assert report.max_held_blocks == max(predicted)
    assert report.block_copies >= 1          # the two-sample request copied its shared last block
    # every prompt token once, every sample's decode token once
    decode = int(((tr.output_tokens - 1) * tr.n).sum())
    assert report.tokens_written == int(tr.prompt_tokens.sum()) + decode


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_replay_matches_kvsim_through_preemptions(preemption):
    # the `ideal` profile pins the step timing that makes 8 blocks overflow (vllm-v1's CUDA-graph steps
    # finish each request before the next arrives: no preemption to replay)
    report, _ = run(small_trace(), replace(config(8, preemption), engine_profile="ideal"))
    assert report.preemptions >= 1
    assert report.ok, report


def test_replay_with_prefix_cache_hits():
    tr = small_trace(prefix=True)
    report, _ = run(tr, config(200, prefix=True))
    assert report.ok, report
    assert report.tokens_written < int(tr.prompt_tokens.sum()) + int((tr.output_tokens - 1).sum())


def test_a_wrong_prediction_is_reported_at_its_step():
    tr, cfg = small_trace(), config(200)
    predicted = simulate(tr, cfg).steps.used_blocks.tolist()
    predicted[3] += 1
    report = replay(tr, cfg, TINY, "cpu", predicted, check_every=50)
    assert not report.ok
    assert report.first_mismatch.startswith(f"step 3: kvsim predicted {predicted[3]} blocks")


def test_lost_copy_on_write_shows_as_an_attention_error(monkeypatch):
    monkeypatch.setattr(replay_mod._Pool, "copy", lambda self, mapping: None)   # the copies never run
    report, _ = run(small_trace(n=[2] * 8), config(200))
    assert report.worst_abs_err > 1e-2 and not report.ok


def test_a_double_booked_block_is_caught_by_the_pool_audit(monkeypatch):
    """Fault injection: the allocator hands the second sequence admitted the first one's first block
    (still live) in place of the fresh block it took off the free list. Both prompts are written in
    step 0; the second overwrites the first's tokens 0-7, and the counters count a block no table holds."""
    original, order = PagedAllocator.allocate, []

    def double_booking(self, seq_id, *args, **kwargs):
        cached = original(self, seq_id, *args, **kwargs)
        order.append(seq_id)
        if len(order) == 2:
            self._seqs[seq_id].table[0] = self._seqs[order[0]].table[0]
        return cached

    trace = Trace.from_arrays(np.zeros(2), np.array([20, 20]), np.array([3, 3]))
    healthy = replay(trace, config(200), TINY, "cpu", check_every=1000)
    assert healthy.ok and healthy.verified_tokens > 0, healthy
    monkeypatch.setattr(PagedAllocator, "allocate", double_booking)
    report = replay(trace, config(200), TINY, "cpu", check_every=1000)
    assert not report.ok
    assert report.first_mismatch == ("step 0: sequence 0 token 0 (block 0, layer 0) reads back other data; "
                                     "block 0 is in the tables of sequences [0, 1]")


def test_a_leaked_block_is_caught_by_the_count(monkeypatch):
    """Fault injection: every sequence's first free() forgets to release its last block; the allocator's
    counters then count a block no live table holds."""
    original, leaked = PagedAllocator.free, []

    def leaky_free(self, seq_id):
        if not leaked:
            leaked.append(self._seqs[seq_id].table.pop())
        original(self, seq_id)

    monkeypatch.setattr(PagedAllocator, "free", leaky_free)
    trace = Trace.from_arrays(np.array([0.0, 0.0]), np.array([20, 20]), np.array([2, 5]))
    report = replay(trace, config(200, async_scheduling=False), TINY, "cpu", check_every=1000)
    assert report.first_mismatch.startswith("step 2: kvsim's allocator counts ")
    # async scheduling: request 0 (finished at step 1) is held through step 2 and freed at its end
    leaked.clear()
    report = replay(trace, config(200), TINY, "cpu", check_every=1000)
    assert report.first_mismatch.startswith("step 3: kvsim's allocator counts ")


def test_contiguous_allocator_is_refused():
    cfg = config(200)
    with pytest.raises(ValueError, match="paged allocator"):
        replay(small_trace(), replace(cfg, cache=replace(cfg.cache, allocator="contiguous")), TINY, "cpu")


def test_a_model_with_kv_cache_groups_replays_from_the_command_line(tmp_path):
    """gpt-oss keeps sliding-window layers (W = 128) beside full ones: the replay drives one block table
    per KV cache group (tests/gpu_harness/test_replay_hybrid.py has the windows at work)."""
    trace = tmp_path / "one.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 40, "output_tokens": 5}\n')
    res = CliRunner().invoke(harness_app, ["replay", str(trace), "--model", "gpt-oss-20b", "--gpu", "h100-80gb",
                                           "--num-blocks", "20000", "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0 and "equal at every step" in res.output, res.output
    assert '"sliding (W=128): 1 layer(s)",\n    "full: 1 layer(s)"' in (tmp_path / "r.json").read_text()


def test_jenga_allocator_is_refused():
    """Jenga's two-level pages are not vLLM's block tables: still refused, in one line."""
    cfg = SimConfig(Deployment(get_model("gpt-oss-20b"), get_gpu("h100-80gb")),
                    CacheConfig(kv_gib=10, allocator="jenga"))
    with pytest.raises(ValueError, match="paged allocator"):
        replay(small_trace(), cfg, TINY, "cpu")


def test_replay_command_on_a_shipped_trace(tmp_path):
    res = CliRunner().invoke(harness_app, ["replay", TINY_TRACE, "--max-requests", "5",
                                           "--num-blocks", "12", "--check-every", "4",
                                           "--json", str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    assert "equal at every step" in res.output
    assert '"ok": true' in (tmp_path / "r.json").read_text()


def test_replay_command_checks_a_steps_csv_from_kvsim_run(tmp_path):
    flags = ["--max-requests", "5", "--num-blocks", "12"]
    res = CliRunner().invoke(kvsim_app, ["run", TINY_TRACE, *flags, "--quiet", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    steps = tmp_path / "run" / "steps.csv"
    res = CliRunner().invoke(harness_app, ["replay", TINY_TRACE, *flags, "--check-every", "50",
                                           "--expect", str(steps)])
    assert res.exit_code == 0 and "equal at every step" in res.output, res.output

    lines = steps.read_text().splitlines()
    header = lines[0].split(",")
    col = header.index("used_blocks")
    row = lines[4].split(",")
    row[col] = str(int(row[col]) + 1)
    lines[4] = ",".join(row)
    steps.write_text("\n".join(lines) + "\n")
    res = CliRunner().invoke(harness_app, ["replay", TINY_TRACE, *flags, "--check-every", "50",
                                           "--expect", str(steps)])
    assert res.exit_code == 1 and "step 3" in res.output, res.output


def test_replay_command_names_an_unreadable_expect_file(tmp_path):
    bad = tmp_path / "steps.csv"
    bad.write_text("step,blocks\n0,1\n")
    res = CliRunner().invoke(harness_app, ["replay", TINY_TRACE, "--expect", str(bad)])
    said = res.output.replace("\n", "")   # the console folds a long temporary path at its width
    assert res.exit_code == 2 and "steps.csv" in said and "used_blocks" in said


@pytest.mark.parametrize("name, cache", [
    ("alpaca-300-llama-3-8b-h200", {}),
    ("alpaca-300-llama-3-8b-h200-48blocks-swap", {"num_blocks": 48}),
])
def test_device_check_predictions_are_the_simulators(name, cache):
    """gpu_harness/device_check.sh replays these on a GPU against the shipped prediction files, which
    must stay what kvsim predicts for the same flags."""
    cfg = SimConfig(Deployment(get_model("llama-3-8b"), get_gpu("h200")), CacheConfig(**cache),
                    SchedulerConfig(preemption="swap" if cache else "recompute"), engine_profile="ideal")
    trace = load_trace(ROOT / "traces" / "alpaca_30rps_2min.jsonl").head(300)
    predicted = simulate(trace, cfg).steps.used_blocks.tolist()
    shipped = ROOT / "gpu_harness" / "expected" / f"{name}.csv"
    rows = shipped.read_text().splitlines()
    assert rows[0] == "step,used_blocks"
    assert [int(r.split(",")[1]) for r in rows[1:]] == predicted
    assert f"{name}:" in (ROOT / "gpu_harness" / "device_check.sh").read_text()


def test_replay_with_beams_reads_shared_blocks_and_copies_on_write(monkeypatch):
    """Beam search on real kernels: dead beams re-fork surviving ones (they then read the parent's
    physical blocks), `copy_blocks` performs each copy-on-write before the write that needs it, and
    every beam's attention equals the reference over its own unshared (contiguous) copy of its K/V.
    Without the copies (fault injection) the outputs differ."""
    trace = Trace.from_arrays([0.0, 0.01], [19, 13], [9, 7], beam_width=[3, 2])
    cfg = replace(config(200), scheduler=SchedulerConfig(beam_death_rate=0.5))
    sim = simulate(trace, cfg)
    assert sim.summary["beam"]["forks"] >= 4
    report = replay(trace, cfg, TINY, "cpu", sim.steps.used_blocks.tolist())
    assert report.ok, report
    assert report.block_copies >= sim.summary["beam"]["forks"] // 2
    monkeypatch.setattr(replay_mod._Pool, "copy", lambda self, mapping: None)
    broken = replay(trace, cfg, TINY, "cpu", check_every=1)
    assert not broken.ok and broken.worst_abs_err > 1e-2
