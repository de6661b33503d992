"""Independent sample lengths (kvsim/engine/batching/samples.py): a hand-computed three-sample request whose shorter
samples end early and free their own blocks, the `uniform` mode, the fast-forward staying exact, and
the trace field `output_tokens_per_sample` (reader, writer, one-line errors)."""

import json
import re

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.batching.samples import sample_ends
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace
from kvsim.trace.jsonl import read_jsonl, write_jsonl

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))
runner = CliRunner()


def test_three_samples_of_their_own_lengths_by_hand():
    """Prompt 6, lengths [5, 2, 3] -> samples numbered longest first: seq 0 runs 5, seq 1 3, seq 2 2.
    4-token blocks. step 0 prefill: [0, 1] shared by all three (2 used).
    step 1: the three write slot 7 into shared block 1: seq 0 copies it to 2, seq 1 to 3, seq 2 writes
      in place (4 used); seq 2 has emitted its 2 tokens: freed, block 1 with it.
    step 2: seqs 0 and 1 fill blocks 2 and 3 (3 used); seq 1 ends, block 3 freed.
    step 3: seq 0 takes a fresh block, 4 (3 used: 0, 2, 4). step 4: its last token (3 used)."""
    trace = Trace.from_arrays([0.0], [6], [5], n=[3], output_tokens_per_sample=[[5, 2, 3]])
    parts = build_run(trace, SimConfig(DEP, CacheConfig(block_size=4, num_blocks=16), engine_profile="ideal"))
    parts.scheduler.add(0, 0.0)
    stepper, now, p = Stepper(parts.scheduler, ConstantCost(1.0)), 0.0, []
    while (plan := stepper.step(now, tables=True)) is not None:
        p.append(plan)
        now = plan.end_s
    assert [x.memory[0].used_blocks for x in p] == [2, 4, 3, 3, 3]
    assert [x.decode_seqs for x in p] == [0, 3, 2, 1, 1]
    assert [x.copies for x in p] == [[], [(1, 2), (1, 3)], [], [], []]
    assert [x.samples_ended for x in p] == [[], [2], [1], [], []]
    assert [x.finished for x in p] == [[], [], [], [], [0]]
    assert p[3].tables == {0: [0, 2, 4]}
    assert parts.scheduler.request_columns()["n"].tolist() == [3]
    parts.allocator.check_invariants()
    assert parts.allocator.num_free_blocks == 16


def test_uniform_lengths_are_seeded_and_no_longer_than_the_request():
    trace = Trace.from_arrays([0.0] * 50, [10] * 50, list(range(1, 51)), n=4, beam_width=[1] * 49 + [2])
    a, b = sample_ends(trace, "uniform", 3), sample_ends(trace, "uniform", 3)
    assert a == b and a != sample_ends(trace, "uniform", 4)
    assert 49 not in a and sample_ends(trace, "equal", 3) == {}       # beams and `equal` run to the end
    for i, ends in a.items():
        assert ends == sorted(ends, reverse=True) and len(ends) <= 3
        assert all(1 <= x < trace.output_tokens[i] for x in ends)
    given = Trace.from_arrays([0.0], [10], [9], n=3, output_tokens_per_sample=[[4, 9, 9]])
    assert sample_ends(given, "uniform", 0) == {0: [4]}                 # the trace's lengths win


def test_shorter_samples_save_memory_and_fast_forward_stays_exact():
    trace = Trace.from_arrays([0.0, 0.1, 0.3, 0.35], [40, 90, 17, 200], [60, 33, 80, 120], n=[4, 1, 3, 6])
    def run(mode, fast=True):
        cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=300), SchedulerConfig(sample_lengths=mode),
                        engine_profile="ideal")
        return simulate(trace, cfg, cost=ConstantCost(0.01), fast_forward=fast).summary
    fast, slow, equal = run("uniform"), run("uniform", False), run("equal")
    assert fast["kv"] == slow["kv"] and fast["engine_steps"] == slow["engine_steps"] == equal["engine_steps"]
    assert fast["kv"]["mean_fraction"]["token_states"] < equal["kv"]["mean_fraction"]["token_states"]
    assert fast["requests_finished"] == 4


def test_per_sample_lengths_round_trip(tmp_path):
    t = Trace.from_arrays([0.0, 1.0], [5, 6], [7, 3], n=[2, 1], output_tokens_per_sample=[[3, 7], None])
    write_jsonl(t, tmp_path / "t.jsonl")
    assert '"output_tokens_per_sample": [3, 7]' in (tmp_path / "t.jsonl").read_text()
    back = read_jsonl(tmp_path / "t.jsonl")
    assert back.sample_lengths(0) == [3, 7] and back.sample_lengths(1) is None
    assert back.slice(1, 2).sample_lengths(0) is None and t.head(1).sample_lengths(0) == [3, 7]
    with pytest.raises(ValueError, match="output_tokens_per_sample"):
        Trace.from_arrays([0.0], [5], [7], n=[2], output_tokens_per_sample=[[3, 6]])


GOOD = '{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 30, "n": 2, "output_tokens_per_sample": [30, 4]}\n'


@pytest.mark.parametrize("field, message", [
    ('"n": 2, "output_tokens_per_sample": 30', "must be a list of integers"),
    ('"n": 2, "output_tokens_per_sample": [30, "4"]', "must be a list of integers"),
    ('"n": 3, "output_tokens_per_sample": [30, 4]', "must hold n = 3 lengths, got 2"),
    ('"output_tokens_per_sample": [30, 4]', "must hold n = 1 lengths, got 2"),
    ('"n": 2, "output_tokens_per_sample": [31, 4]', r"lengths in \[1, output_tokens = 30\]"),
    ('"n": 2, "output_tokens_per_sample": [29, 4]', "with 30 the largest"),
    ('"n": 2, "output_tokens_per_sample": [30, 0]', r"lengths in \[1, output_tokens = 30\]"),
    ('"n": 2, "beam_width": 2, "output_tokens_per_sample": [30, 4]', "cannot be combined with 'beam_width'"),
])
def test_bad_per_sample_lengths_exit_2_naming_file_line_and_field(tmp_path, field, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(GOOD + '{"arrival_s": 1, "prompt_tokens": 20, "output_tokens": 30, ' + field + "}\n")
    res = runner.invoke(app, ["run", str(path), "--kv-gib", "1", "--quiet"])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "bad.jsonl:2: field 'output_tokens_per_sample'" in lines[0]
    assert re.search(message, lines[0]), lines[0]


def test_cli_sample_lengths_flag_is_recorded(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text('{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 30, "n": 4}\n')
    res = runner.invoke(app, ["run", str(path), "--kv-gib", "1", "--quiet", "--sample-lengths", "uniform",
                              "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "o" / "config.json").read_text())["scheduler"]["sample_lengths"] == "uniform"
    bad = runner.invoke(app, ["run", str(path), "--kv-gib", "1", "--quiet", "--sample-lengths", "poisson"])
    assert bad.exit_code == 2 and "--sample-lengths" in bad.output
