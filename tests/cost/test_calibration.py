"""Calibration files: validation, refusal of interpreter timings, and how the fit replaces the defaults."""

from __future__ import annotations

import copy
import json
import math

import pytest

from kvsim.cost.calibration import Calibration, load_calibration
from kvsim.cost.roofline import CostModel
from kvsim.specs import Deployment, GpuSpec, ModelSpec

TINY = ModelSpec("tiny", 2, 64, 4, 4, 16, 2, 1024, 1e6)          # 512 bytes of KV per token
TOY_GPU = GpuSpec("toy", 10**9, 1e9, 1e12, 1e8)

GOOD = {
    "format": "kvsim-calibration/1", "created": "2026-11-29T12:00:00Z", "device": "NVIDIA H200",
    "backend": "cuda", "usable_for_prediction": True,
    "fit": {"decode_attn_fixed_s": 1e-5, "decode_attn_bytes_per_s": 1e12,
            "paged_overhead": {"16": 1.1, "4": 1.5, "32": 1.05},
            "store_kv_fixed_s": 3e-6, "store_kv_bytes_per_s": 5e11},
    "measurements": [],
}


def write(tmp_path, doc, name="cal.json"):
    path = tmp_path / name
    path.write_text(json.dumps(doc))
    return path


def with_fit(**changes):
    doc = copy.deepcopy(GOOD)
    doc["fit"].update(changes)
    return doc


def test_loads_a_good_file(tmp_path):
    cal = load_calibration(write(tmp_path, GOOD))
    assert cal.device == "NVIDIA H200" and cal.source.endswith("cal.json")
    assert cal.paged_overhead == ((4, 1.5), (16, 1.1), (32, 1.05))     # sorted by block size
    with pytest.raises(AttributeError):
        cal.decode_attn_fixed_s = 0.0                                   # frozen


def test_calibration_replaces_decode_attention_and_store(tmp_path):
    cal = load_calibration(write(tmp_path, GOOD))
    paged = CostModel(Deployment(TINY, TOY_GPU), 16, paged=True, calibration=cal)
    contiguous = CostModel(Deployment(TINY, TOY_GPU), 16, paged=False, calibration=cal)
    # 2 layers x 10 us + 400 tokens x 512 B / 1e12 B/s, times 1.1 for paged at block 16.
    by_file = 2 * 1e-5 + 400 * 512 / 1e12
    assert contiguous.decode_attention_time(4, 400) == pytest.approx(by_file)
    assert paged.decode_attention_time(4, 400) == pytest.approx(1.1 * by_file)
    assert paged.store_kv_time(4) == pytest.approx(2 * 3e-6 + 4 * 512 / 5e11)


def test_doubling_the_file_bandwidth_halves_the_byte_term(tmp_path):
    slow = load_calibration(write(tmp_path, with_fit(decode_attn_fixed_s=0.0), "slow.json"))
    fast = load_calibration(write(tmp_path, with_fit(decode_attn_fixed_s=0.0, decode_attn_bytes_per_s=2e12),
                                  "fast.json"))
    t_slow = CostModel(Deployment(TINY, TOY_GPU), 16, True, slow).decode_attention_time(8, 8000)
    t_fast = CostModel(Deployment(TINY, TOY_GPU), 16, True, fast).decode_attention_time(8, 8000)
    assert t_fast == pytest.approx(t_slow / 2)


def test_paged_overhead_interpolates_log_linearly_and_clamps(tmp_path):
    cal = load_calibration(write(tmp_path, GOOD))
    assert cal.paged_overhead_at(16) == 1.1
    assert cal.paged_overhead_at(8) == pytest.approx(1.3)        # halfway from 4 to 16 in log2
    assert cal.paged_overhead_at(23) == pytest.approx(1.1 - 0.05 * (math.log2(23) - 4))
    assert cal.paged_overhead_at(1) == 1.5                        # clamped below
    assert cal.paged_overhead_at(256) == 1.05                     # clamped above


def test_single_block_size_table_is_constant():
    cal = Calibration("mem", "gpu", 0.0, 1e12, 0.0, 1e12, ((16, 1.2),))
    assert cal.paged_overhead_at(1) == cal.paged_overhead_at(16) == cal.paged_overhead_at(512) == 1.2


def test_interpreter_file_refused_unless_forced(tmp_path):
    doc = copy.deepcopy(GOOD) | {"backend": "interpreter", "device": "cpu-interpreter",
                                 "usable_for_prediction": False}
    path = write(tmp_path, doc)
    with pytest.raises(ValueError, match=r"cal\.json: usable_for_prediction is false .*interpreter.*force=True"):
        load_calibration(path)
    assert load_calibration(path, force=True).device == "cpu-interpreter"


@pytest.mark.parametrize("doc, match", [
    (GOOD | {"format": "kvsim-calibration/2"}, r"field 'format' must be 'kvsim-calibration/1'"),
    ({k: v for k, v in GOOD.items() if k != "usable_for_prediction"}, r"field 'usable_for_prediction'"),
    (GOOD | {"usable_for_prediction": "yes"}, r"'usable_for_prediction' must be true or false"),
    ({k: v for k, v in GOOD.items() if k != "fit"}, r"field 'fit' is missing"),
    (with_fit(decode_attn_bytes_per_s=None), r"'fit\.decode_attn_bytes_per_s' is missing"),
    (with_fit(decode_attn_bytes_per_s=0), r"'fit\.decode_attn_bytes_per_s' must be positive"),
    (with_fit(store_kv_bytes_per_s=-1e12), r"'fit\.store_kv_bytes_per_s' must be positive"),
    (with_fit(decode_attn_fixed_s=-1e-6), r"'fit\.decode_attn_fixed_s' must be non-negative"),
    (with_fit(store_kv_fixed_s="3us"), r"'fit\.store_kv_fixed_s' must be a finite number"),
    (with_fit(decode_attn_bytes_per_s=True), r"'fit\.decode_attn_bytes_per_s' must be a finite number"),
    (with_fit(paged_overhead={}), r"'fit\.paged_overhead' must be a non-empty object"),
    (with_fit(paged_overhead={"sixteen": 1.1}), r"block size 'sixteen'"),
    (with_fit(paged_overhead={"0": 1.1}), r"block size '0'"),
    (with_fit(paged_overhead={"16": 0}), r"'fit\.paged_overhead\.16' must be a positive number"),
    ([1, 2], r"must hold a JSON object"),
])
def test_invalid_files_name_file_and_field(tmp_path, doc, match):
    with pytest.raises(ValueError, match=r"bad\.json: .*" + match):
        load_calibration(write(tmp_path, doc, "bad.json"))


def test_unreadable_file(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match=r"broken\.json: cannot read calibration file"):
        load_calibration(tmp_path / "broken.json")
    with pytest.raises(ValueError, match=r"missing\.json: cannot read calibration file"):
        load_calibration(tmp_path / "missing.json")
