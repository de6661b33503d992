"""Every vLLM flag a user pastes works in every command that simulates or sizes, in the Python API and
in sweep grids (issue 22 items 2 and 8): the flags that change a prediction change it by the amounts
worked out by hand below; the others are accepted and listed as ignored."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

import kvsim
from kvsim.cli.app import app
from kvsim.planning.runs import make_config
from kvsim.planning.vllm_flags import VLLM_FLAGS, split_argv, translate
from kvsim.specs import GIB

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "traces" / "tiny.jsonl"
runner = CliRunner()

#: Llama-3-8B: 8.03e9 parameters, vocab 128256 x hidden 4096 untied = 1,050,673,152 embedding weights.
EMB = 2 * 128256 * 4096
PARAMS = 8.03e9


@pytest.mark.parametrize("flags, weights_bytes", [
    ({}, PARAMS * 2),                                              # bf16
    ({"dtype": "float32"}, PARAMS * 4),
    ({"quantization": "fp8"}, (PARAMS - EMB) * 1 + EMB * 2),
    ({"quantization": "bitsandbytes"}, (PARAMS - EMB) * 0.5 + EMB * 2),
    # awq/gptq: 4 bits + (fp16 scale + 4-bit zero) per group of 128 = 0.5 + 2.5 / 128 bytes
    ({"quantization": "awq"}, (PARAMS - EMB) * (0.5 + 2.5 / 128) + EMB * 2),
    ({"quantization": "gptq", "dtype": "float16"}, (PARAMS - EMB) * (0.5 + 2.5 / 128) + EMB * 2),
])
def test_dtype_and_quantization_set_the_weights(flags, weights_bytes):
    spec = make_config(model="llama-3-8b", **flags).deployment.model
    assert spec.weight_bytes == pytest.approx(weights_bytes, rel=1e-12)
    # the KV cache follows --dtype unless --kv-cache-dtype says otherwise: 2 x 32 x 8 x 128 x bytes
    assert spec.kv_bytes_per_token() == 2 * 32 * 8 * 128 * (4 if flags.get("dtype") == "float32" else 2)
    assert make_config(model="llama-3-8b", kv_cache_dtype="fp8", **flags).deployment.model.kv_bytes == 1


def test_bad_dtype_and_quantization_are_one_line_errors():
    with pytest.raises(ValueError, match="--dtype: unknown 'int3'"):
        make_config(dtype="int3")
    res = runner.invoke(app, ["run", str(TINY), "--quantization", "int3"])
    assert res.exit_code == 2 and "--quantization: unknown 'int3'" in res.output
    res = runner.invoke(app, ["run", str(TINY), "--dtype"])
    assert res.exit_code == 2 and "--dtype needs a value" in res.output


def test_a_quantized_checkpoint_keeps_its_own_bytes(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 512,
        "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}}))
    spec = make_config(model_config=str(tmp_path), quantization="bitsandbytes").deployment.model
    with pytest.raises(ValueError, match="bitsandbytes checkpoint"):     # vLLM refuses a different method
        make_config(model_config=str(tmp_path), quantization="fp8")
    # bitsandbytes 4-bit: 0.5 byte per linear weight; embeddings (2 x 1000 x 256) in bf16
    emb = 2 * 1000 * 256
    linear = 2 * (2 * 256 * 256 + 2 * 256 * 256 + 3 * 256 * 512)
    assert spec.weight_bytes == linear * 0.5 + emb * 2


def test_enforce_eager_adds_kernel_launches_to_each_step():
    # vllm-project/vllm#1440: 1.5 ms per decode step for 32 layers -> 32 x 1.5e-3 / 32 s per step, in
    # series with the kernels under the roofline profiles (vllm-2023 here)
    base = make_config(model="llama-3-8b", engine_profile="vllm-2023").resolved().engine_profile
    eager = make_config(model="llama-3-8b", enforce_eager=True, engine_profile="vllm-2023").resolved()
    assert eager.engine_profile.cpu_step_s == pytest.approx(base.cpu_step_s + 1.5e-3)
    assert eager.resolved().engine_profile.cpu_step_s == eager.engine_profile.cpu_step_s   # once only
    tr = kvsim.load_trace(TINY)
    slow = kvsim.simulate(tr, model="llama-3-8b", kv_gib=4, enforce_eager=True, engine_profile="vllm-2023").summary
    fast = kvsim.simulate(tr, model="llama-3-8b", kv_gib=4, engine_profile="vllm-2023").summary
    assert slow["tpot_s"]["p50"] > fast["tpot_s"]["p50"] + 1e-3
    # vllm-v1's time model runs eagerly itself (no CUDA graphs: a step is at least the host's launches,
    # kvsim/cost/v1_time.py): its CPU time is untouched, and 8B's 13 ms of kernels on an A100 hide 1.5 ms
    v1 = make_config(model="llama-3-8b", enforce_eager=True).resolved()
    assert v1.engine_profile.cpu_step_s == make_config(model="llama-3-8b").resolved().engine_profile.cpu_step_s
    slow = kvsim.simulate(tr, model="llama-3-8b", kv_gib=4, enforce_eager=True).summary
    fast = kvsim.simulate(tr, model="llama-3-8b", kv_gib=4).summary
    assert fast["tpot_s"]["p50"] <= slow["tpot_s"]["p50"] < fast["tpot_s"]["p50"] * 1.01


def test_python_api_takes_vllm_names_and_drops_ignored_ones():
    tr = kvsim.load_trace(TINY)
    vllm = kvsim.simulate(tr, model="llama-2-13b", tensor_parallel_size=2, gpu_memory_utilization=0.8,
                          max_num_batched_tokens=4096, num_gpu_blocks_override=501, swap_space=2,
                          enable_chunked_prefill=True, no_enable_prefix_caching=True, trust_remote_code=True,
                          port=8000, served_model_name="x").summary
    native = kvsim.simulate(tr, model="llama-2-13b", tp=2, gpu_mem_util=0.8, max_batched_tokens=4096,
                            num_blocks=500, swap_gib=2, chunked_prefill=True, prefix_caching=False).summary
    vllm.pop("sim_wall_s"), native.pop("sim_wall_s")
    assert vllm == native


def test_every_vllm_flag_reaches_a_config_field():
    """Each flag of the table that changes a prediction lands on a field make_config knows."""
    values = {"tp": 2, "gpu_mem_util": 0.8, "kv_cache_dtype": "fp8", "max_batched_tokens": 4096,
              "max_num_seqs": 64, "max_model_len": 1024, "block_size": 32, "swap_gib": 2, "num_blocks": 500,
              "dtype": "float16", "quantization": "fp8", "seed": 3, "prefix_caching": False,
              "chunked_prefill": False, "enforce_eager": True, "hybrid_kv_cache": False, "dp": 2,
              "enable_expert_parallel": True, "prefix_cache_retention_interval": 64, "async_scheduling": False}
    for name, spec in VLLM_FLAGS.items():
        if spec.run_flag is None:
            continue
        value = values[spec.run_flag] if spec.switch is None else True
        moe = spec.run_flag == "enable_expert_parallel"        # (experts to spread: a MoE model)
        cfg = make_config(model="mixtral-8x7b" if moe else "llama-2-13b", **{name.replace("-", "_"): value})
        flat = {**kvsim.planning.runs.config_row(cfg), "tp": cfg.deployment.tp, "dp": cfg.deployment.dp,
                "enable_expert_parallel": cfg.deployment.ep,
                "kv_cache_dtype": cfg.deployment.model.kv_bytes, "dtype": cfg.deployment.model.dtype_bytes,
                "max_model_len": cfg.deployment.model.max_seq_len,
                "quantization": cfg.deployment.model.weight_bytes_per_param}
        expect = {"kv_cache_dtype": 1, "dtype": 2, "quantization": 1.0}.get(spec.run_flag, values[spec.run_flag])
        if spec.null_block:                  # vLLM's --num-gpu-blocks-override counts its null block
            expect -= 1
        if spec.switch is not None:
            expect = spec.switch
        assert flat[spec.run_flag] == expect, name


def test_sweep_grids_take_vllm_names(tmp_path):
    tr = kvsim.load_trace(TINY)
    df = kvsim.run_sweep({"gpu_memory_utilization": [0.5, 0.9], "enable_prefix_caching": ["false"]},
                         {"model": "llama-2-7b", "port": 8000, "max_num_batched_tokens": 2048}, trace=tr,
                         workers=1)
    assert df.status.tolist() == ["ok", "ok"] and df.gpu_mem_util.tolist() == [0.5, 0.9]
    assert df.max_batched_tokens.tolist() == [2048, 2048]
    assert df.prefix_caching.astype(str).str.lower().tolist() == ["false", "false"]
    assert df.kv_capacity_tokens.iloc[0] < df.kv_capacity_tokens.iloc[1]


def test_translate_and_split_argv():
    assert translate({"enable_prefix_caching": "false", "q": "awq", "host": "x"}) == (
        {"prefix_caching": False, "quantization": "awq"}, ["host"])
    rest, flags, ignored = split_argv(["t.jsonl", "--tp", "2", "--dtype=half", "--port", "80", "--enforce-eager",
                                       "--model", "m"], {"--tp", "--model"})
    assert rest == ["t.jsonl", "--tp", "2", "--model", "m"]
    assert flags == {"dtype": "half", "enforce_eager": True} and ignored == ["--port"]
    # vLLM 0.33 deprecates --mamba-cache-mode with no effect (Mamba prefix caching follows
    # --enable-prefix-caching): accepted and ignored
    rest, flags, ignored = split_argv(["t.jsonl", "--mamba-cache-mode", "align", "--enable-prefix-caching"], set())
    assert rest == ["t.jsonl"] and flags == {"prefix_caching": True} and ignored == ["--mamba-cache-mode"]


def _json(tmp_path, *args):
    out = tmp_path / "out.json"
    res = runner.invoke(app, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text()), res.output


PASTED = ["--gpu-memory-utilization", "0.5", "--max-num-batched-tokens", "2048", "--dtype", "bfloat16",
          "--quantization", "fp8", "--no-enable-prefix-caching", "--enforce-eager", "--trust-remote-code",
          "--port", "8000", "--host", "0.0.0.0", "--served-model-name", "llama", "--disable-log-requests"]
IGNORED = ["--disable-log-requests", "--host", "--port", "--served-model-name", "--trust-remote-code"]


def test_run_compare_and_capacity_take_a_pasted_command_line(tmp_path):
    base = ["--model", "llama-3-8b", "--gpu", "a100-80gb"]
    run, output = _json(tmp_path, "run", str(TINY), *base, *PASTED)
    assert run["vllm_flags_ignored"] == IGNORED and "accepted and ignored" in output
    mem = run["memory"]
    # fp8 weights (8.03e9 - EMB) x 1 + EMB x 2 bytes; activation 2048 x 20 x 4096 x 2 bytes
    assert mem["model_weights_gib"] == pytest.approx(((PARAMS - EMB) + EMB * 2) / GIB)
    assert mem["activation_peak_gib"] == 2048 * 20 * 4096 * 2 / GIB and mem["gpu_memory_utilization"] == 0.5
    cap, _ = _json(tmp_path, "capacity", *base, *PASTED)
    assert cap["memory"] == mem and cap["vllm_flags_ignored"] == IGNORED
    assert cap["static"][0]["capacity_tokens"] == mem["kv_cache_tokens"]
    cmp, _ = _json(tmp_path, "compare", str(TINY), *base, *PASTED, "--quiet")
    assert cmp["paged"]["memory"] == mem and cmp["paged"]["vllm_flags_ignored"] == IGNORED


def test_tune_block_size_and_report_take_vllm_flags(tmp_path):
    res = runner.invoke(app, ["tune-block-size", str(TINY), "--model", "llama-2-7b", "--block-sizes", "16,32",
                              "--workers", "1", "--gpu-memory-utilization", "0.5", "--port", "1",
                              "--json", str(tmp_path / "t.json")])
    assert res.exit_code == 0, res.output
    assert "--port" in res.output
    res = runner.invoke(app, ["tune-block-size", str(TINY), "--gpu-memory-utilisation", "0.5"])
    assert res.exit_code == 2


def test_a_switch_not_given_keeps_the_runs_default():
    """`kvsim run` passes its `--async-scheduling/--no-async-scheduling` as None when neither is given; that
    must leave vLLM's default (on), not turn it off (the switch read None as false before)."""
    from kvsim.engine.config import async_scheduling_on
    from kvsim.planning.runs import make_config

    assert translate({"async_scheduling": None}) == ({"async_scheduling": None}, [])
    assert translate({"no_async_scheduling": True}) == ({"async_scheduling": False}, [])
    cfg = make_config(model="opt-13b", gpu="a100-40gb")
    assert async_scheduling_on(make_config(cfg, async_scheduling=None))
    assert not async_scheduling_on(make_config(cfg, async_scheduling=False))
