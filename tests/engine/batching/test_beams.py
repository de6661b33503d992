"""Beam search (kvsim/engine/batching/beams.py): the seeded death model, a two-beam case computed by hand through the
step plan (blocks used, copies, frees), contiguous per-beam reservations, and the run-level wiring
(flag, config.json, summary, fast-forward)."""

import json

import pytest

from kvsim.engine.batching.beams import BeamModel
from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
from kvsim.engine.build import build_run
from kvsim.cost.roofline import ConstantCost
from kvsim.engine.sim import simulate
from kvsim.specs import Deployment, get_gpu, get_model
from kvsim.engine.step import Stepper
from kvsim.trace.table import Trace

DEP = Deployment(get_model("opt-13b"), get_gpu("a100-40gb"))


class Scripted:
    """A BeamModel stand-in returning scripted (parent, replaced) pairs, one list per call."""

    def __init__(self, script):
        self.script, self.calls = list(script), []

    def replacements(self, request, k):
        self.calls.append((request, k))
        return self.script.pop(0)

    def forget(self, request):
        pass


def plans(trace, cache, script=None, **sched):
    parts = build_run(trace, SimConfig(DEP, cache, SchedulerConfig(**sched), engine_profile="ideal"))
    if script is not None:
        parts.scheduler.beams = script
    for i in range(len(trace)):
        parts.scheduler.add(i, 0.0)
    stepper, now, out = Stepper(parts.scheduler, ConstantCost(1.0)), 0.0, []
    while (plan := stepper.step(now, tables=parts.block_size > 1)) is not None:
        out.append(plan)
        now = plan.end_s
    return out, parts


def test_two_beams_by_hand():
    """Prompt 6, output 6, 2 beams, 4-token blocks, 8 blocks (fresh blocks come in id order).
    step 0 prefill: seq 0 = [0, 1] (block 1 holds 2 slots), seq 1 forks it: 2 blocks used (4 unshared).
    step 1 (first decode, no deaths yet): seq 0 writes slot 7 into shared block 1 -> copy 1 -> 2,
      seq 0 = [0, 2]; seq 1 writes into block 1, now its own: 3 used.
    step 2: beam 1 dies, replaced by a fork of beam 0: seq 1 drops [0, 1] (block 1 freed, block 0
      back to one holder) and shares [0, 2]; seq 0 writes slot 8 into shared block 2 -> copy 2 -> 3,
      seq 0 = [0, 3]; seq 1 fills block 2 in place: 3 used (0, 2, 3), 4 unshared.
    step 3: no death; both cross a block boundary: seq 0 takes 4, seq 1 takes 5: 5 used, 6 unshared.
    step 4: beam 0 dies, replaced by a fork of beam 1: seq 0 drops [0, 3, 4] (3 and 4 freed) and
      shares [0, 2, 5]; it writes slot 10 into shared block 5 -> copy 5 -> 6: 4 used (0, 2, 5, 6).
    step 5 (last token): both write in place: 4 used; then both beams are freed."""
    script = Scripted([[(0, 1)], [], [(1, 0)], []])
    p, parts = plans(Trace.from_arrays([0.0], [6], [6], beam_width=[2]),
                     CacheConfig(block_size=4, num_blocks=8), script)
    assert len(p) == 6 and script.calls == [(0, 2)] * 4      # deaths drawn from the 2nd generated token
    assert [x.memory[0].used_blocks for x in p] == [2, 3, 3, 5, 4, 4]
    assert [x.memory[0].unshared_blocks for x in p] == [4, 4, 4, 6, 6, 6]
    assert [x.copies for x in p] == [[], [(1, 2)], [(2, 3)], [], [(5, 6)], []]
    assert [x.reforked for x in p] == [[], [], [(0, 1)], [], [(1, 0)], []]
    assert p[0].forked == [(0, 1)] and p[0].tables == {0: [0, 1], 1: [0, 1]}
    assert p[2].tables == {0: [0, 3], 1: [0, 2]}
    assert p[4].tables == {0: [0, 2, 6], 1: [0, 2, 5]}
    assert p[5].finished == [0] and parts.scheduler.beam_forks == 2
    parts.allocator.check_invariants()
    assert parts.allocator.num_free_blocks == 8


def test_contiguous_keeps_one_reservation_per_beam_and_copies_on_fork():
    """Same request, contiguous oracle reservations (11 slots each) in 64 slots: the refork copies
    the parent's written slots (7 at step 2: prompt 6 + 1 output; 9 at step 4) into the dead beam's
    own reservation; each beam holds its own 11 slots throughout."""
    script = Scripted([[(0, 1)], [], [(1, 0)], []])
    cache = CacheConfig(allocator="contiguous", reserve="oracle", placement="first-fit", num_blocks=64)
    p, parts = plans(Trace.from_arrays([0.0], [6], [6], beam_width=[2]), cache, script)
    assert [x.memory[0].used_blocks for x in p] == [22] * 6          # two 11-slot reservations throughout
    assert [x.copied_slots for x in p] == [0, 0, 7, 0, 9, 0]
    assert [x.memory[0].token_states for x in p] == [12, 14, 16, 18, 20, 22]
    assert parts.scheduler.beam_copied_slots == 16
    parts.allocator.check_invariants()


def test_death_model_is_seeded_per_request_and_never_kills_every_beam():
    a, b = BeamModel(0.3, seed=7), BeamModel(0.3, seed=7)
    draws_a = [a.replacements(r, 4) for r in (0, 1) for _ in range(200)]
    draws_b = [b.replacements(r, 4) for r in (0, 1) for _ in range(200)]
    assert draws_a == draws_b and draws_a != [BeamModel(0.3, seed=8).replacements(0, 4) for _ in range(200)]
    # request 1's draws do not depend on whether request 0 drew first
    c = BeamModel(0.3, seed=7)
    assert [c.replacements(1, 4) for _ in range(200)] == draws_a[200:]
    deaths = 0
    for pairs in draws_a:
        dead = [child for _, child in pairs]
        assert len(set(dead)) == len(dead) < 4
        assert all(parent not in dead for parent, _ in pairs)
        deaths += len(dead)
    assert 0.25 < deaths / (400 * 4) < 0.35      # about the death rate
    heavy = BeamModel(0.99, seed=1)
    assert all(len(heavy.replacements(0, 3)) == 2 for _ in range(50))     # one beam always survives
    with pytest.raises(ValueError, match="beam death rate"):
        BeamModel(1.0, seed=0)


def test_beams_share_more_than_samples_and_fast_forward_stays_exact():
    trace = Trace.from_arrays([0.0, 0.2, 0.4], [40, 90, 17], [60, 33, 80], beam_width=[4, 1, 3])
    cfg = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=200), engine_profile="ideal")
    fast = simulate(trace, cfg, cost=ConstantCost(0.01))
    slow = simulate(trace, cfg, cost=ConstantCost(0.01), fast_forward=False)
    assert fast.summary["engine_steps"] == slow.summary["engine_steps"]
    assert fast.summary["kv"] == slow.summary["kv"] and fast.summary["beam"] == slow.summary["beam"]
    assert fast.summary["beam"]["forks"] > 0
    samples = SimConfig(DEP, CacheConfig(block_size=8, num_blocks=200), SchedulerConfig(beam_death_rate=0.0),
                        engine_profile="ideal")
    plain = simulate(trace, samples, cost=ConstantCost(0.01)).summary
    assert plain["beam"]["forks"] == 0
    assert fast.summary["kv"]["sharing_saved_fraction"] > plain["kv"]["sharing_saved_fraction"] + 0.1


def test_cli_records_the_death_rate_and_refuses_a_bad_one(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli.app import app
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 20, "output_tokens": 30, "beam_width": 3}\n')
    r = CliRunner().invoke(app, ["run", str(trace), "--kv-gib", "1", "--beam-death-rate", "0.5", "--quiet",
                                 "--out", str(tmp_path / "o")])
    assert r.exit_code == 0, r.output
    assert json.loads((tmp_path / "o" / "config.json").read_text())["scheduler"]["beam_death_rate"] == 0.5
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["beam"]["death_rate"] == 0.5 and summary["beam"]["forks"] > 0
    bad = CliRunner().invoke(app, ["run", str(trace), "--kv-gib", "1", "--beam-death-rate", "1.5", "--quiet"])
    assert bad.exit_code == 2 and "--beam-death-rate" in bad.output
