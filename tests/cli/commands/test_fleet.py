"""`kvsim run --replicas N --router ...` end to end, and its bad input: one line naming the flag, exit 2."""

import json

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app

runner = CliRunner()
TRACE = "traces/mooncake_conversation_excerpt.jsonl"


@pytest.mark.parametrize("args,flag", [
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "2", "--router", "random"], "--router"),
    (["--replicas", "2", "--router-cache-threshold", "1.5"], "--router-cache-threshold"),
    (["--prefix-caching", "--cpu-kv-gib", "5000"], "--cpu-kv-gib"),
    (["--no-prefix-caching", "--cpu-kv-gib", "4"], "--cpu-kv-gib"),
    (["--engine-profile", "vllm-2023", "--cpu-kv-gib", "4"], "--cpu-kv-gib"),    # its default: no caching
    (["--prefix-caching", "--cpu-kv-gib", "-1"], "--cpu-kv-gib"),
])
def test_bad_fleet_flags_are_one_line_naming_the_flag(args, flag):
    res = runner.invoke(app, ["run", TRACE, "--quiet", "--max-requests", "5", *args])
    assert res.exit_code == 2, res.output
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert len(lines) == 1 and flag in lines[0], res.output


def test_a_fleet_run_writes_its_summary_with_replicas_and_routing(tmp_path):
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["run", TRACE, "--max-requests", "40", "--prefix-caching", "--replicas", "2",
                              "--router", "prefix-aware", "--model", "llama-3-8b", "--gpu", "h100-80gb",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    s = json.loads(out.read_text())
    fleet = s["fleet"]
    assert fleet["replicas"] == 2 and sum(fleet["routed"]) == 40 == s["requests_total"]
    assert sum(fleet["decisions"].values()) == 40 and len(fleet["per_replica"]) == 2
    assert [r["requests_total"] for r in fleet["per_replica"]] == fleet["routed"]
    assert "prefix-aware router" in res.output and "imbalance" in res.output


def _fleet_run(out, replicas="2", router="round-robin", *extra):
    return runner.invoke(app, ["run", TRACE, "--max-requests", "5", "--quiet", "--model", "llama-3-8b",
                               "--gpu", "h100-80gb", "--replicas", replicas, "--router", router,
                               "--out", str(out), *extra])


def test_a_fleet_run_writes_its_folder_per_replica_and_routing(tmp_path):
    import pandas as pd

    out = tmp_path / "fleet"
    res = _fleet_run(out, "2", "round-robin", "--json", str(tmp_path / "s.json"))
    assert res.exit_code == 0, res.output
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()) == [
        "config.json", "replicas/0/steps.csv", "replicas/0/summary.json", "replicas/1/steps.csv",
        "replicas/1/summary.json", "requests.csv", "routing.csv", "summary.json"]
    s = json.loads((out / "summary.json").read_text())
    assert s == json.loads((tmp_path / "s.json").read_text())           # the file --json writes
    assert json.loads((out / "config.json").read_text())["fleet"] == {
        "replicas": 2, "router": "round-robin", "balance_abs": 64, "balance_rel": 1.5, "cache_threshold": 0.3}
    # round-robin over 5 requests in arrival order: replicas 0, 1, 0, 1, 0
    routing, req = pd.read_csv(out / "routing.csv"), pd.read_csv(out / "requests.csv")
    assert routing.replica.tolist() == [0, 1, 0, 1, 0] and routing.request.tolist() == [0, 1, 2, 3, 4]
    assert req.set_index("id").loc[routing.id, "replica"].tolist() == [0, 1, 0, 1, 0]
    assert "rule" not in routing                                         # (prefix-aware only)
    for r in (0, 1):
        own = json.loads((out / "replicas" / str(r) / "summary.json").read_text())
        assert own == s["fleet"]["per_replica"][r] and own["requests_total"] == [3, 2][r]
        steps = pd.read_csv(out / "replicas" / str(r) / "steps.csv")
        assert len(steps) == own["engine_steps"] > 0 and steps.step.tolist() == list(range(len(steps)))
        assert steps.time_s.iloc[-1] + steps.duration_s.iloc[-1] == pytest.approx(own["duration_s"])
    assert not list(out.rglob(".*.tmp")) and not (out / "INCOMPLETE").exists()


def test_prefix_aware_routing_says_which_rule_decided(tmp_path):
    import pandas as pd

    out = tmp_path / "fleet"
    res = _fleet_run(out, "2", "prefix-aware", "--prefix-caching")
    assert res.exit_code == 0, res.output
    routing = pd.read_csv(out / "routing.csv")
    decisions = json.loads((out / "summary.json").read_text())["fleet"]["decisions"]
    assert routing.rule.value_counts().to_dict() == decisions
    assert ((routing.cached_blocks >= 0) & (routing.cached_blocks <= routing.prompt_blocks)).all()
    assert routing.outstanding.iloc[0] == 0                              # the first request finds nothing


def test_a_folder_holds_one_result_whatever_ran_there_before(tmp_path):
    out = tmp_path / "run"
    assert _fleet_run(out, "3").exit_code == 0
    assert _fleet_run(out, "2").exit_code == 0                           # replica 2's files go
    assert sorted(p.name for p in (out / "replicas").iterdir()) == ["0", "1"]
    (out / "replicas" / "1" / "notes.txt").write_text("mine")           # not kvsim's: kept
    res = runner.invoke(app, ["run", TRACE, "--max-requests", "5", "--quiet", "--model", "llama-3-8b",
                              "--gpu", "h100-80gb", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "replicas", "requests.csv", "steps.csv",
                                                     "summary.json"]
    assert [str(p.relative_to(out)) for p in (out / "replicas").rglob("*")] == ["replicas/1", "replicas/1/notes.txt"]
    assert _fleet_run(out, "2").exit_code == 0                           # the plain run's steps.csv goes
    assert not (out / "steps.csv").exists() and (out / "routing.csv").exists()
    res = runner.invoke(app, ["run", TRACE, "--max-requests", "5", "--quiet", "--model", "llama-3-8b", "--gpu",
                              "h100-80gb", "--prefill-replicas", "1", "--decode-replicas", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output                                # disaggregated: the fleet's files go
    assert sorted(p.name for p in out.rglob("*")) == ["1", "config.json", "notes.txt", "replicas", "requests.csv",
                                                      "summary.json"]


def test_a_fleet_out_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    res = _fleet_run(blocker, "2")
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "--out" in lines[0] and "not a folder" in lines[0]


def test_a_fleet_folder_that_fails_midway_says_incomplete(tmp_path, monkeypatch):
    from kvsim.cli import run_files

    real = run_files.write_text_atomic

    def failing(path, text, flag=None):
        if path.name == "config.json":
            raise ValueError(f"{flag} {path}: cannot write: No space left on device")
        return real(path, text, flag)

    monkeypatch.setattr(run_files, "write_text_atomic", failing)
    out = tmp_path / "fleet"
    res = _fleet_run(out, "2")
    assert res.exit_code == 2 and "--out" in res.output and "config.json" in res.output
    assert (out / "INCOMPLETE").exists() and not (out / "summary.json").exists()
    assert not list(out.rglob(".*.tmp"))
