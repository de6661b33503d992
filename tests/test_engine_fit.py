"""Engine profiles' CPU constants: fitted from step-time CSVs (`kvsim calibrate-engine`), the shipped
defaults reproduced from their source rows, and bad files named by line and column."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cost import profiles
from kvsim.cli.app import app
from kvsim.cost.roofline import CostModel
from kvsim.cost.profile_fit import fit_cpu, read_cpu_times
from kvsim.cost.profiles import PROFILES, get_profile
from kvsim.specs import Deployment, get_gpu, get_model

ROOT = Path(__file__).resolve().parents[1]
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
    kernel = CostModel(dep, 16, paged=False, step_overhead_s=0.0)
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


def test_shipped_defaults_are_the_fits_of_their_source_rows():
    v0 = fit_cpu(*read_cpu_times(ROOT / "calibration" / "vidur-a100-vllm-v0-cpu.csv"))
    v1 = fit_cpu(*read_cpu_times(ROOT / "calibration" / "vidur-a100-vllm-v1-cpu.csv"))
    assert (round(v0.cpu_step_s, 5), round(v0.cpu_seq_s, 6)) == (profiles.VLLM_V0_CPU_STEP_S, profiles.VLLM_V0_CPU_SEQ_S)
    assert (round(v1.cpu_step_s, 6), round(v1.cpu_seq_s, 6)) == (profiles.VLLM_V1_CPU_STEP_S, profiles.VLLM_V1_CPU_SEQ_S)
    assert PROFILES["vllm-2023"].cpu_seconds(64) == pytest.approx(2.02e-3 + 64 * 1.71e-4)


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
