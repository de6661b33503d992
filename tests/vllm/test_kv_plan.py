"""kvsim's start-up figures for hybrid models against vLLM 0.33's own functions.

Stored: tests/data/vllm_kv_plan_0.33.0.json holds, for every hybrid preset at several KV memory sizes,
tensor-parallel degrees, maximum lengths and batched-token budgets, with the hybrid KV cache manager
on and off, what vLLM itself computed (tests/vllm/vllm_kv_plan_driver.py in the oracle venv: its
`_align_hybrid_block_size`, KV cache specs, `get_kv_cache_groups`, `get_kv_cache_configs`,
`get_kv_cache_capacity`; Mamba states from its model classes on the config.json in
tests/data/hf_configs). kvsim's `plan_kv_cache` must give the same block size, num_blocks, number of
groups, "GPU KV cache size" tokens and maximum concurrency, and refuse where vLLM refuses. No vLLM needed.

Live: where the oracle venv exists ($ORACLE_VENV, default ~/.cache/vllm-oracle-venv) the driver is run
again on every stored case and must reproduce the stored values. Regenerate the file with
`python tests/vllm/test_kv_plan.py --regenerate` (needs the venv).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvsim.specs import GIB, get_model
from kvsim.specs.hf.config import load_hf_config
from kvsim.specs.kv_groups import plan_kv_cache

HERE = Path(__file__).parent
TESTS = Path(__file__).parents[1]
STORED = TESTS / "data" / "vllm_kv_plan_0.33.0.json"
VENV = Path(os.environ.get("ORACLE_VENV", Path.home() / ".cache" / "vllm-oracle-venv"))
MEMORIES = (6 * GIB, 24 * GIB, 70_000_012_345)
#: (preset, TP degrees, max_model_len values: None is the model's own)
MODELS = (("gpt-oss-20b", (1, 2, 8), (None, 8192)), ("gpt-oss-120b", (1, 4), (None,)),
          ("gemma-3-27b", (1, 2, 4), (None, 32768)), ("llama-4-scout", (2, 8), (131072, 1048576)),
          ("deepseek-v3", (1, 8), (None, 32768)), ("qwen3-next-80b-a3b", (1, 2, 4), (None, 32768)),
          ("nemotron-h-8b", (1, 2, 8), (None,)), ("jamba-v0.1", (1, 2), (None, 32768)))


def _model(name: str):
    """The preset, or for a model without one the spec read from tests/data/hf_configs."""
    try:
        return get_model(name)
    except ValueError:
        return load_hf_config(TESTS / "data" / "hf_configs" / f"{name}.json")
#: (hybrid manager, --max-num-batched-tokens, prefix caching: Mamba's "align" mode, two state blocks, three with
#: the prefill checkpoint block of a Mamba-2 mixer, Nemotron-H)
VARIANTS = ((True, 8192, False), (False, 8192, False), (True, 2048, False), (True, 8192, True))


def _cases() -> list[dict]:
    cases = []
    for name, tps, lengths in MODELS:
        for tp in tps:
            for length in lengths:
                for memory in MEMORIES:
                    for hybrid, batched, prefix in VARIANTS:
                        cases.append(dict(model=name, tp=tp, block_size=16,
                                          max_model_len=_model(name).with_max_model_len(length).max_seq_len,
                                          max_num_batched_tokens=batched, kv_bytes_per_gpu=int(memory),
                                          hybrid=hybrid, prefix_caching=prefix))
    return cases


def _driver_input(case: dict) -> dict:
    """A case as the vLLM driver takes it: the config.json (its text config) and the layers by kind."""
    cfg = json.loads((TESTS / "data" / "hf_configs" / f"{case['model']}.json").read_text())
    layers = [dict(kind=g.kind, count=g.num_layers, num_kv_heads=g.num_kv_heads, head_dim=g.head_dim,
                   window=g.window, chunk=g.chunk, latent_dim=g.latent_dim) for g in _model(case["model"]).groups]
    return dict(case, architecture=cfg["architectures"][0], hf_config=cfg.get("text_config", cfg),
                mamba_ssm_cache_dtype="float32" if cfg.get("model_type") == "nemotron_h" else None,
                layers=layers)


def _kvsim(case: dict) -> dict:
    model = _model(case["model"]).with_max_model_len(case["max_model_len"])
    try:
        plan = plan_kv_cache(model, case["tp"], case["block_size"], kv_bytes_per_gpu=case["kv_bytes_per_gpu"],
                             max_num_batched_tokens=case["max_num_batched_tokens"], hybrid=case["hybrid"],
                             prefix_caching=case["prefix_caching"])
    except ValueError as exc:
        return {"error": str(exc)}
    return {"block_size": plan.block_size, "num_blocks": plan.num_blocks, "num_groups": len(plan.groups),
            "max_concurrency": plan.max_concurrency, "capacity_tokens": plan.capacity_tokens}


def _run_vllm(cases: list[dict]) -> list[dict]:
    proc = subprocess.run([str(VENV / "bin" / "python"), str(HERE / "vllm_kv_plan_driver.py")],
                          input=json.dumps([_driver_input(c) for c in cases]), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _same(kvsim: dict, vllm: dict) -> bool:
    if "error" in vllm or "error" in kvsim:
        return ("error" in vllm) == ("error" in kvsim)
    return all(kvsim[k] == vllm[k] for k in ("block_size", "num_blocks", "num_groups", "capacity_tokens")) \
        and kvsim["max_concurrency"] == pytest.approx(vllm["max_concurrency"], rel=1e-12)


def _stored() -> dict:
    return json.loads(STORED.read_text())


def test_stored_cases_cover_every_hybrid_preset_and_both_managers():
    stored = _stored()
    assert stored["cases"] == _cases()          # the stored inputs are what this file generates
    assert {c["model"] for c in stored["cases"]} == {m for m, _, _ in MODELS}
    ok = [r for r in stored["results"] if "error" not in r]
    assert len(ok) > 100 and any("error" in r for r in stored["results"])


@pytest.mark.parametrize("index", range(len(_cases())))
def test_kvsim_equals_vllm(index):
    stored = _stored()
    case, vllm = stored["cases"][index], stored["results"][index]
    kvsim = _kvsim(case)
    assert _same(kvsim, vllm), (case["model"], case["tp"], case["kv_bytes_per_gpu"], case["hybrid"], kvsim, vllm)


@pytest.mark.long
def test_live_vllm_reproduces_the_stored_figures():
    if not (VENV / "bin" / "python").exists():
        pytest.skip(f"no vLLM oracle venv at {VENV} (set ORACLE_VENV); the stored figures were checked above")
    stored = _stored()
    live = _run_vllm(stored["cases"])
    for case, was, now in zip(stored["cases"], stored["results"], live):
        assert _same(now, was) and ("error" in now) == ("error" in was), (case["model"], was, now)


if __name__ == "__main__" and "--regenerate" in sys.argv:
    cases = _cases()
    results = _run_vllm(cases)
    STORED.write_text("{\"vllm\": \"0.33.0\",\n\"cases\": [\n" + ",\n".join(map(json.dumps, cases))
                      + "],\n\"results\": [\n" + ",\n".join(map(json.dumps, results)) + "]}\n")
    print(f"wrote {STORED}: {len(cases)} cases")
