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
