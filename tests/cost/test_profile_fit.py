"""Engine profiles' CPU constants: fitted from step-time CSVs (`kvsim calibrate-engine`), the shipped
defaults reproduced from their source rows, and bad files named by line and column."""

import json
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.cost.v1_time import V1CostModel
from kvsim.cost.roofline import CostModel
from kvsim.cost.profile_fit import fit_cpu, read_cpu_times
from kvsim.cost.profiles import PROFILES, get_profile
from kvsim.specs import Deployment, get_gpu, get_model

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def test_fit_recovers_a_line_exactly(tmp_path):
    csv = tmp_path / "cpu.csv"
    # 1.5 ms + 0.2 ms per sequence
    csv.write_text("batch_size,cpu_ms,other\n4,2.3,x\n10,3.5,y\n20,5.5,z\n")
    fit = fit_cpu(*read_cpu_times(csv))
    assert fit.cpu_step_s == pytest.approx(1.5e-3) and fit.cpu_seq_s == pytest.approx(2e-4)
    assert fit.rms_error_s == pytest.approx(0, abs=1e-12) and fit.rows == 3


def test_fit_keeps_constants_non_negative(tmp_path):
    csv = tmp_path / "cpu.csv"
    csv.write_text("batch_size,cpu_ms\n10,1.0\n20,3.0\n")     # free fit: -1 ms + 0.2 ms per sequence
    fit = fit_cpu(*read_cpu_times(csv))
    assert fit.cpu_step_s == 0 and fit.cpu_seq_s == pytest.approx((10 * 1e-3 + 20 * 3e-3) / 500)
    csv.write_text("batch_size,cpu_ms\n10,3.0\n20,1.0\n")     # decreasing: a constant, the mean
    fit = fit_cpu(*read_cpu_times(csv))
    assert (fit.cpu_step_s, fit.cpu_seq_s) == (pytest.approx(2e-3), 0.0)


def test_step_times_have_the_kernel_time_subtracted(tmp_path):
    dep = Deployment(get_model("llama-3-8b"), get_gpu("h100-80gb"))
    # the vllm-v1 base's own kernel time (kvsim/cost/v1_time.py: graphs up to 512 sequences)
    kernel = V1CostModel(dep, 16, max_num_seqs=256)
    rows = ["batch_size,step_ms,context_tokens"]
    for batch in (8, 32, 128):   # measured = kernel + 0.4 ms + 30 us per sequence
        rows.append(f"{batch},{(kernel.step_time(0, 0, batch, batch * 500) + 4e-4 + 3e-5 * batch) * 1e3!r},500")
    (tmp_path / "itl.csv").write_text("\n".join(rows) + "\n")
    res = runner.invoke(app, ["calibrate-engine", str(tmp_path / "itl.csv"), "--base", "vllm-v1", "--model",
                              "llama-3-8b", "--gpu", "h100-80gb", "-o", str(tmp_path / "fit.json")])
    assert res.exit_code == 0, res.output
    fitted = get_profile(str(tmp_path / "fit.json"))
    assert fitted.cpu_step_s == pytest.approx(4e-4) and fitted.cpu_seq_s == pytest.approx(3e-5)
    assert fitted.chunked_prefill and not fitted.separate_prefill      # the base's policy
    assert json.loads((tmp_path / "fit.json").read_text())["base"] == "vllm-v1"


@pytest.mark.parametrize("profile, variant, rows", [
    ("vllm-2023", "central", "vidur-a100-vllm-v0-cpu-median.csv"),
    ("vllm-2023", "low", "vidur-a100-2024-05-vllm-v0-cpu-median.csv"),
    ("vllm-2023", "high", "vidur-a100-vllm-v0-cpu.csv"),
    ("vllm-v1", "central", "vidur-a100-vllm-v1-cpu-median.csv"),
    ("vllm-v1", "low", "vidur-a100-2024-05-vllm-v1-cpu-median.csv"),
    ("vllm-v1", "high", "vidur-a100-vllm-v1-cpu.csv"),
])
def test_shipped_variants_are_the_fits_of_their_source_rows(profile, variant, rows):
    fit = fit_cpu(*read_cpu_times(ROOT / "calibration" / rows))
    p = get_profile(f"{profile}:{variant}")
    step, seq = p.cpu_step_s, p.cpu_seq_s
    if p.time_model == "vllm-v1":    # (the CPU work async scheduling overlaps; the gap stays 0.16 ms)
        step, seq = p.overlap_cpu_step_s, p.overlap_cpu_seq_s
        assert (p.cpu_step_s, p.cpu_seq_s) == (1.6e-4, 0.0)
    assert step == pytest.approx(fit.cpu_step_s, rel=6e-3) and seq == pytest.approx(fit.cpu_seq_s, rel=6e-3)
    assert p.name == f"{profile}:{variant}" and p.variant == variant
    assert p.separate_prefill == PROFILES[profile].separate_prefill       # the variant changes CPU time only


def test_median_rows_are_the_sum_of_their_phases():
    # cpu_ms of the median files is schedule + sampler + prepare inputs + process outputs (v0) or
    # schedule + prepare inputs (v1), read off Vidur's *_MEDIAN columns
    for name in ("vidur-a100-vllm-v0-cpu-median.csv", "vidur-a100-2024-05-vllm-v0-cpu-median.csv",
                 "vidur-a100-vllm-v1-cpu-median.csv"):
        lines = (ROOT / "calibration" / name).read_text().splitlines()[1:]
        for line in lines:
            cells = [float(x) for x in line.split(",")]
            assert cells[1] == pytest.approx(sum(cells[2:]), abs=2e-4)
    # Vidur Jan 2024, batch 64, medians: 0.9522 + 1.3703 + 1.1630 + 4.1083 ms
    row64 = (ROOT / "calibration" / "vidur-a100-vllm-v0-cpu-median.csv").read_text().splitlines()[-1]
    assert row64.startswith("64,7.5937")


def test_plain_name_is_central_and_bad_variants_are_one_line():
    assert get_profile("vllm-2023") == replace(get_profile("vllm-2023:central"), name="vllm-2023")
    # central at batch 150: 1.20 ms + 150 x 0.100 ms = 16.2 ms (the old means fit gave 27.7 ms)
    assert get_profile("vllm-2023").cpu_seconds(150) == pytest.approx(16.2e-3, rel=1e-3)
    with pytest.raises(ValueError, match="no variant 'mid'; variants: one of low, central, high"):
        get_profile("vllm-2023:mid")
    with pytest.raises(ValueError, match="has no variant 'low'"):
        get_profile("ideal:low")
    res = runner.invoke(app, ["run", "x.jsonl", "--engine-profile", "vllm-v1:huge"])
    assert res.exit_code == 2 and "no variant 'huge'" in res.output, res.output


@pytest.mark.parametrize("text, message", [
    ("batch,cpu_ms\n1,2\n", "needs a batch_size column and a cpu_ms or step_ms column"),
    ("batch_size,cpu_ms\n1,2\n3,abc\n", ":3: column 'cpu_ms': not a number: 'abc'"),
    ("batch_size,cpu_ms\n1.5,2\n3,4\n", ":2: column 'batch_size': must be an integer >= 1"),
    ("batch_size,cpu_ms\n4,2\n4,3\n", "need measurements at two batch sizes"),
    ("batch_size,step_ms\n4,2\n8,3\n", "step_ms needs a context_tokens column"),
])
def test_bad_csv_is_one_line_naming_line_and_column(tmp_path, text, message):
    (tmp_path / "bad.csv").write_text(text)
    res = runner.invoke(app, ["calibrate-engine", str(tmp_path / "bad.csv"), "-o", str(tmp_path / "p.json")])
    assert res.exit_code == 2 and message in res.output, res.output
    assert not (tmp_path / "p.json").exists()


def test_unknown_profiles_and_bad_profile_files(tmp_path):
    with pytest.raises(ValueError, match="unknown profile 'vllm-2099'; known: vllm-2023, vllm-v1, ideal"):
        get_profile("vllm-2099")
    (tmp_path / "p.json").write_text(json.dumps({"base": "vllm-v1", "cpu_step_s": -1, "cpu_seq_s": 0}))
    with pytest.raises(ValueError, match="cpu_step_s must be a finite number >= 0"):
        get_profile(str(tmp_path / "p.json"))
    (tmp_path / "q.json").write_text(json.dumps({"cpu_step_s": 0, "cpu_seq_s": 0}))
    with pytest.raises(ValueError, match="q.json: engine profile needs field 'base'"):
        get_profile(str(tmp_path / "q.json"))
