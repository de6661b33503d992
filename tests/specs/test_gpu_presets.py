"""GPU presets against their datasheet figures (../shared/calibration/engine-evidence/gpus.csv), and
`--gpu-config FILE`: parsing, bad files, and the command line's one-line errors."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvsim.cli.app import app
from kvsim.specs import GIB, get_gpu
from kvsim.specs.gpu import load_gpu_config

EVIDENCE = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "engine-evidence" / "gpus.csv"
ROOT = Path(__file__).resolve().parents[2]

#: preset: (HBM GB/s, dense bf16 TFLOP/s, dense fp8 TFLOP/s, link GB/s per direction), from the vendor
#: datasheets as engine-evidence/gpus.csv lists them (RTX PRO 6000: derived there by halving).
DATASHEET = {
    "h100-80gb": (3350, 989, 1979, 450), "h200": (4800, 989, 1979, 450), "b200": (8000, 2250, 4500, 900),
    "mi300x": (5300, 1307, 2615, 448), "l40s": (864, 362, 733, 0), "l4": (300, 121, 242, 0),
    "rtx-4090": (1008, 165, 330, 0), "rtx-pro-6000": (1792, 500, 1000, 0), "a100-80gb": (2039, 312, 0, 300),
}
#: the evidence file's row name for each preset
ROWS = {"h100-80gb": ("H100", "SXM5"), "h200": ("H200", None), "b200": ("B200", None), "mi300x": ("MI300X", None),
        "l40s": ("L40S", None), "l4": ("L4", None), "rtx-4090": ("RTX 4090", None),
        "rtx-pro-6000": ("RTX PRO 6000 Blackwell", None), "a100-80gb": ("A100-80GB", "SXM4")}


@pytest.mark.parametrize("name", sorted(DATASHEET))
def test_preset_figures_are_the_datasheets(name):
    g = get_gpu(name)
    hbm, bf16, fp8, link = DATASHEET[name]
    assert (g.hbm_bytes_per_s, g.bf16_flops, g.fp8_flops, g.link_bytes_per_s) == (hbm * 1e9, bf16 * 1e12,
                                                                                   fp8 * 1e12, link * 1e9)
    assert (g.link == "pcie") == (link == 0)


def test_presets_agree_with_the_evidence_file():
    if not EVIDENCE.exists():
        pytest.skip(f"{EVIDENCE} is absent")
    rows = list(csv.DictReader(EVIDENCE.open()))
    for name, (gpu, form) in ROWS.items():
        row = next(r for r in rows if r["gpu"] == gpu and (form is None or r["form_factor"] == form))
        num = lambda f: float(row[f].lstrip("~").split()[0]) if row[f] else 0.0   # noqa: E731
        g = get_gpu(name)
        assert g.hbm_bytes_per_s == num("mem_bw_gb_s") * 1e9, name
        assert g.bf16_flops == num("bf16_dense_tflops") * 1e12, name
        assert g.fp8_flops == num("fp8_dense_tflops") * 1e12, name
        # memory as CUDA reports it: a little under the nominal size (0.90-0.999 of it as GiB)
        assert 0.90 <= g.memory_bytes / (num("memory_gb") * GIB) <= 0.999, name


def test_aliases_and_case():
    assert get_gpu("H100") is get_gpu("h100-80gb") and get_gpu("RTX4090") is get_gpu("rtx-4090")


def write(tmp_path, doc, name="my-gpu.json") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return path


GOOD = {"memory_gib": 44.4, "hbm_gb_s": 864, "bf16_tflops": 362, "fp8_tflops": 733, "pcie_gb_s": 25}


def test_gpu_config_reads_datasheet_units(tmp_path):
    g = load_gpu_config(write(tmp_path, GOOD))
    assert (g.name, g.memory_bytes, g.hbm_bytes_per_s, g.bf16_flops, g.fp8_flops, g.pcie_bytes_per_s, g.link) == \
        ("my-gpu", int(44.4 * GIB), 864e9, 362e12, 733e12, 25e9, "pcie")
    nv = load_gpu_config(write(tmp_path, {**GOOD, "name": "x", "interconnect": "nvlink", "interconnect_gb_s": 450}))
    assert (nv.name, nv.link, nv.link_bytes_per_s) == ("x", "nvlink", 450e9)
    assert get_gpu(str(write(tmp_path, GOOD))).hbm_bytes_per_s == 864e9       # --gpu FILE.json too
    minimal = load_gpu_config(write(tmp_path, {"memory_gib": 24, "hbm_gb_s": 300, "bf16_tflops": 121}))
    assert (minimal.fp8_flops, minimal.pcie_bytes_per_s) == (0.0, 25e9)


@pytest.mark.parametrize("doc, message", [
    ({"hbm_gb_s": 1, "bf16_tflops": 1}, "needs field 'memory_gib'"),
    ({**GOOD, "hbm_gb_s": -1}, "field 'hbm_gb_s' must be positive"),
    ({**GOOD, "bf16_tflops": "fast"}, "field 'bf16_tflops' must be a finite number"),
    ({**GOOD, "memory": 1}, "unknown field 'memory'"),
    ({**GOOD, "interconnect": "infiniband"}, "field 'interconnect' must be one of nvlink, xgmi, pcie"),
    ({**GOOD, "interconnect": "nvlink"}, "'interconnect_gb_s' must be positive for interconnect 'nvlink'"),
    ({**GOOD, "interconnect_gb_s": 100}, "must be 0 or absent for interconnect 'pcie'"),
    ("[1, 2]", "must hold a JSON object"),
    ("{not json", "cannot read GPU config"),
])
def test_bad_gpu_config_names_file_and_field(tmp_path, doc, message):
    path = write(tmp_path, doc)
    with pytest.raises(ValueError, match=f"^{path}: .*") as err:
        load_gpu_config(path)
    assert message in str(err.value)


def test_command_line_errors_are_one_line(tmp_path):
    runner = CliRunner()
    trace = str(ROOT / "traces" / "tiny.jsonl")
    bad = write(tmp_path, {"memory_gib": 24})
    res = runner.invoke(app, ["run", trace, "--gpu-config", str(bad), "--quiet"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0
    assert "needs field 'hbm_gb_s'" in res.output
    res = runner.invoke(app, ["run", trace, "--gpu", "tpu-v9", "--quiet"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0
    assert "rtx-pro-6000" in res.output and "--gpu-config" in res.output
    good = write(tmp_path, {**GOOD, "memory_gib": 80, "hbm_gb_s": 3350, "bf16_tflops": 989})
    out = tmp_path / "s.json"
    res = runner.invoke(app, ["run", trace, "--gpu-config", str(good), "--model", "llama-2-7b", "--quiet",
                              "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["requests_finished"] > 0


def test_every_command_takes_a_gpu_file_through_gpu(tmp_path):
    """`--gpu FILE.json` (kvsim capacity, compare, sweep grids, the Python API) reads the same file."""
    from kvsim.planning.runs import make_config
    path = write(tmp_path, {**GOOD, "memory_gib": 80, "hbm_gb_s": 3350, "bf16_tflops": 989})
    cfg = make_config(model="llama-2-7b", gpu=str(path))
    assert (cfg.deployment.gpu.name, cfg.deployment.gpu.memory_bytes) == ("my-gpu", 80 * GIB)
    res = CliRunner().invoke(app, ["capacity", "--model", "llama-2-7b", "--gpu", str(path)])
    assert res.exit_code == 0, res.output
