"""`kvsim calibrate` per GPU and its client path (issue 37): GPU-side parameters fitted per GPU and never
carried to another one, CPU terms shared where a GPU's rows are too few, the client path's fixed part
fitted by least absolute relative TTFT error. Expected numbers are worked out by hand beside each assert."""

import json

import pytest

from kvsim.validation.client_path import ClientPath, fit_client
from kvsim.validation.fit import covers_every_request, with_values
from kvsim.validation.fit_rows import Row, fit_by_gpu

BASE = {"gpu_time_scale": 1.0, "allreduce_delta_s": 0.0, "cpu_step_s": 1.6e-4, "cpu_seq_s": 0.0}


def _rows(gpu, scale, step, seq, delta=0.0, tp2=False):
    # tpot = scale K + delta T + step + seq n, TP 1 rows (T = 0) and, with tp2, TP 2 rows of 32 layers (T = 64)
    pts = [(0.01, 10), (0.02, 40), (0.015, 80), (0.03, 20), (0.025, 60), (0.012, 100)]
    out = [Row(f"{gpu}-a", i, (k, 0.0, 1.0, n), scale * k + step + seq * n, gpu) for i, (k, n) in enumerate(pts)]
    if tp2:
        out += [Row(f"{gpu}-b", i, (k, 64.0, 1.0, n), scale * k + 64 * delta + step + seq * n, gpu)
                for i, (k, n) in enumerate(pts)]
    return out


def test_each_gpu_keeps_its_own_efficiency_and_a_gpu_without_runs_keeps_the_base():
    rows = _rows("h100-80gb", 0.9, 2e-4, 1e-5, delta=2e-6, tp2=True) + _rows("rtx-4090", 0.8, 2e-4, 1e-5)
    values, why = fit_by_gpu(rows, BASE)
    assert values["h100-80gb"]["gpu_time_scale"] == pytest.approx(0.9)
    assert values["h100-80gb"]["allreduce_delta_s"] == pytest.approx(2e-6)       # TP 1 and TP 2 rows
    assert values["rtx-4090"]["gpu_time_scale"] == pytest.approx(0.8)            # its own, not the H100's
    assert "every run is at TP 1" in why["rtx-4090"]["allreduce_delta_s"]
    # another GPU: efficiency and all-reduce at the base; CPU terms from the GPUs with a fitted efficiency
    assert values[""]["gpu_time_scale"] == 1.0 and values[""]["allreduce_delta_s"] == 0.0
    assert values[""]["cpu_step_s"] == pytest.approx(2e-4) and values[""]["cpu_seq_s"] == pytest.approx(1e-5)
    assert "no runs of this GPU" in why[""]["gpu_time_scale"]


def test_tp2_rows_alone_do_not_fit_a_gpu_efficiency():
    # one TP 2 run on a PCIe GPU: its all-reduce error would be read as the kernels' -> kept at the base
    tp2_only = [Row("pro-b", i, (k, 64.0, 1.0, 50), 1.3 * k + 2e-4 + 5e-4, "rtx-pro-6000")
                for i, k in enumerate([0.01, 0.02, 0.03, 0.04])]
    values, why = fit_by_gpu(_rows("h100-80gb", 0.9, 2e-4, 1e-5) + tp2_only, BASE)
    assert values["rtx-pro-6000"]["gpu_time_scale"] == 1.0
    assert "every run of this GPU is at TP > 1" in why["rtx-pro-6000"]["gpu_time_scale"]
    assert values["rtx-pro-6000"]["cpu_step_s"] == pytest.approx(2e-4)          # the shared CPU fit


def test_calibrated_profile_takes_its_gpus_values(tmp_path):
    from kvsim.cost.profiles import get_profile
    import kvsim
    from kvsim.engine.build import build_run
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"base": "vllm-v1", **BASE, "by_gpu": {"h100-80gb": {**BASE, "gpu_time_scale": 0.5}}}))
    tr = kvsim.Trace.from_arrays([0.0], [32], [4])
    for gpu, factor in (("h100-80gb", 0.5), ("a100-80gb", 1.0)):      # listed GPU: its 0.5; another: 1
        base = build_run(tr, kvsim.make_config(model="llama-2-7b", gpu=gpu)).cost
        cal = build_run(tr, kvsim.make_config(model="llama-2-7b", gpu=gpu, engine_profile=str(path))).cost
        assert cal.step_time(0, 0, 8, 800) == pytest.approx(factor * base.step_time(0, 0, 8, 800))
    prof = with_values(get_profile("vllm-v1"), BASE, by_gpu={"": BASE, "h100-80gb": {**BASE, "cpu_step_s": 1e-3}})
    assert prof.for_gpu("H100-80GB").cpu_step_s == 1e-3 and prof.for_gpu("l4").cpu_step_s == 1.6e-4


def test_client_fit_is_the_weighted_median_gap_and_ignores_an_outlier():
    # gaps (measured - engine - 3 us x 600 prompt tokens) 4, 5, 6 and 60 ms (a stage near saturation);
    # weights 1 / measured TTFT: 1/0.030, 1/0.050, 1/0.060, 1/0.120 -> cumulative 33.3, 53.3, 70.0, 78.3;
    # half of 78.3 is 39.2, first reached at the second gap: 5 ms
    rows = [(0.030, 0.030 - 0.004 - 1.8e-3, 600.0), (0.050, 0.050 - 0.005 - 1.8e-3, 600.0),
            (0.060, 0.060 - 0.006 - 1.8e-3, 600.0), (0.120, 0.120 - 0.060 - 1.8e-3, 600.0)]
    path, why = fit_client(rows, ClientPath())
    assert path.fixed_s == pytest.approx(5e-3) and not why
    assert path.per_prompt_token_s == ClientPath().per_prompt_token_s          # the evidence value kept
    kept, why = fit_client(rows[:1], ClientPath())
    assert kept == ClientPath() and "too few" in why["client_fixed_s"]


def test_only_runs_whose_figures_cover_every_request_are_fitted():
    from kvsim.validation.run import MeasuredRun
    mk = (lambda failures: MeasuredRun(name="r", source="s", server={}, workload={}, client="inference-perf",
                                       measured={-1: {"e2e_ms": 1.0, "ttft_ms": 1.0, "failures": failures}}))
    assert covers_every_request(mk(0)) and covers_every_request(mk(None)) and not covers_every_request(mk(4))


def test_a_bad_per_gpu_value_in_a_profile_file_is_one_line(tmp_path):
    from kvsim.cost.profiles import get_profile
    path = tmp_path / "cal.json"
    path.write_text(json.dumps({"base": "vllm-v1", **BASE, "by_gpu": {"h100-80gb": {**BASE, "gpu_time_scale": -1}}}))
    with pytest.raises(ValueError, match="cal.json: bad engine profile: .*gpu_time_scale must be > 0"):
        get_profile(str(path))
