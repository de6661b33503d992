"""`kvsim report --replicas ...`: the fleet section's numbers on tiny fleets whose routing is worked out
by hand (the prefix each router finds, the imbalance, SLO attainment at SLOs every request meets or
none can), the P:D rows beside colocated fleets of the same GPUs, and the flags' bad input."""

import pandas as pd
import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.planning.studies.fleet_report import fleet_rows, fleet_section, split_rows
from kvsim.planning.reports.document import Report
from kvsim.trace.table import Trace

runner = CliRunner()
# one OPT-13B replica per A100-40GB with 200 blocks of 16 tokens: the four requests below never evict
FLAGS = {"model": "opt-13b", "gpu": "a100-40gb", "num_blocks": 200, "block_size": 16, "prefix_caching": True}


def grouped_trace() -> Trace:
    """Groups g1, g2, g2, g1 with a 64-token shared prefix (4 blocks of 16) in 100-token prompts, 3 output
    tokens each: A and B arrive together, C and D together long after A and B finished."""
    return Trace.from_arrays([0.0, 0.0, 2.0, 2.0], [100] * 4, [3] * 4, prefix_group=["g1", "g2", "g2", "g1"],
                             prefix_tokens=[64] * 4)


def test_routers_table_by_hand():
    # round-robin: A, C on replica 0 and B, D on 1: C (g2) and D (g1) land where their prefix is not, 0 hits.
    # prefix-aware: A, B to the least loaded (0, then 1: A queued on 0); C follows g2 to 1, D g1 to 0: 2 x 64 hit
    # tokens of 400 admitted prompt tokens. Two requests on each replica either way: max/mean 1.
    df = fleet_rows(grouped_trace(), FLAGS, [2], ["round-robin", "prefix-aware"], ttft_slo=1e3, tpot_slo=1e3)
    assert df.router.tolist() == ["round-robin", "prefix-aware"] and df.gpus.tolist() == [2, 2]
    assert df.prefix_cache_hit_rate.tolist() == [0.0, pytest.approx(128 / 400)]
    assert df.requests_max_over_mean.tolist() == [1.0, 1.0]
    assert df.decisions.tolist() == ["", "least-loaded=2 prefix=2"]
    assert df.requests_finished.tolist() == [4, 4] and df.slo_attainment.tolist() == [1.0, 1.0]
    none = fleet_rows(grouped_trace(), FLAGS, [2], ["round-robin"], ttft_slo=1e-9, tpot_slo=1e3)
    assert none.slo_attainment.tolist() == [0.0]                      # no first token within a nanosecond


def test_fleet_thresholds_among_the_flags_apply():
    # out of balance as soon as one replica holds more than another (abs 0, rel 1.0): A least-loaded to 0;
    # B finds loads [1, 0]: balance, to 1; C finds [0, 0] (A and B done): prefix, to 1; D finds [0, 1]: balance
    flags = {**FLAGS, "router_balance_abs": 0, "router_balance_rel": 1.0}
    df = fleet_rows(grouped_trace(), flags, [2], ["prefix-aware"])
    assert df.decisions.tolist() == ["balance=2 least-loaded=1 prefix=1"]


def test_splits_beside_colocated_fleets_of_the_same_gpus():
    rows = split_rows(grouped_trace(), FLAGS, [(1, 1)], ttft_slo=1e3, tpot_slo=1e3)
    assert rows.layout.tolist() == ["1P:1D (nvlink)"] and rows.gpus.tolist() == [2]
    assert rows.requests_finished.tolist() == [4] and rows.slo_attainment.tolist() == [1.0]
    rep = Report("t")
    fleet_section(rep, grouped_trace(), FLAGS, [4], ["round-robin"], splits=[(1, 1)])
    table = next(b[2] for b in rep.blocks if b[0] == "t" and b[1] == "fleet_vs_disagg")
    # 2 GPUs: the 2-replica fleet is run for the comparison though the routers table had 4 replicas only
    assert table.layout.tolist() == ["2 colocated, round-robin", "1P:1D (nvlink)"]
    assert [b[1] for b in rep.blocks if b[0] == "f"] == ["fleet_prefix_hits", "fleet_ttft_p99", "fleet_imbalance",
                                                         "fleet_vs_disagg"]


def test_report_fleet_only_writes_the_fleet_tables(tmp_path):
    out = tmp_path / "r"
    res = runner.invoke(app, ["report", "traces/tiny.jsonl", "--model", "opt-13b", "--kv-gib", "4", "--replicas", "2",
                              "--routers", "round-robin,least-requests", "--fleet-only", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (out / "data").iterdir()) == ["fleet_routers.csv", "workload.csv"]
    df = pd.read_csv(out / "data" / "fleet_routers.csv")
    assert df.router.tolist() == ["round-robin", "least-requests"] and df.replicas.tolist() == [2, 2]
    assert "## Fleets: routers compared" in (out / "report.md").read_text()


@pytest.mark.parametrize("args,flag", [
    (["--pd", "1:1"], "--pd"),
    (["--fleet-only"], "--fleet-only"),
    (["--replicas", "0"], "--replicas"),
    (["--replicas", "2,x"], "--replicas"),
    (["--replicas", "2", "--routers", "random"], "--routers"),
    (["--replicas", "2", "--pd", "1:0"], "--pd"),
    (["--replicas", "2", "--pd", "2"], "--pd"),
    (["--replicas", "2", "--kv-link", "carrier-pigeon"], "--kv-link"),
    (["--replicas", "2", "--ttft-slo", "0"], "--ttft-slo"),
])
def test_bad_fleet_report_flags_are_one_line_naming_the_flag(tmp_path, args, flag):
    res = runner.invoke(app, ["report", "traces/tiny.jsonl", "-o", str(tmp_path / "r"), *args])
    lines = [x for x in res.output.splitlines() if x.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and flag in lines[0], res.output
    assert not (tmp_path / "r").exists()


def test_the_fleet_section_follows_the_single_engine_sections(tmp_path):
    out = tmp_path / "r"
    res = runner.invoke(app, ["report", "traces/tiny.jsonl", "--kv-gib", "4", "--block-sizes", "", "--rates", "1",
                              "--replicas", "2", "--routers", "prefix-aware", "--set", "router_cache_threshold=0.5",
                              "-o", str(out)])
    assert res.exit_code == 0, res.output
    headings = [x for x in (out / "report.md").read_text().splitlines() if x.startswith("## ")]
    assert headings == ["## Workload and deployment", "## Systems at the trace's arrival times",
                        "## Latency against request rate", "## Fleets: routers compared", "## Provenance"]


def test_router_verdict_names_the_lowest_ttft_p99_and_the_routers_within_noise():
    import pandas as pd

    from kvsim.planning.studies.fleet_report import router_verdict
    df = pd.DataFrame({"replicas": [8, 8, 8, 16, 16], "router": ["round-robin", "least-kv", "prefix-aware",
                                                                 "round-robin", "prefix-aware"],
                       "ttft_s_p99": [4.5, 4.6, 6.0, 2.0, 1.0], "prefix_cache_hit_rate": [0.03, 0.04, 0.07, 0.1, 0.2]})
    # 8: 4.6 <= 4.5 x 1.05 = 4.725 (within 5 %), 6.0 is not; 16: 2.0 > 1.05
    assert router_verdict(df) == (
        "At 8 replicas the lowest TTFT p99 is round-robin's (4.5 s); least-kv within 5% of it (no difference "
        "worth a choice on this trace); the most prefix-cache hits, 7.0%, are prefix-aware's. At 16 replicas "
        "the lowest TTFT p99 is prefix-aware's (1 s), more than 5% below every other router; the most "
        "prefix-cache hits, 20.0%, are prefix-aware's.")
