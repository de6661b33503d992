"""vLLM's flag names are aliases of kvsim's: a pasted vLLM command line gives the same run; the model
flags --kv-cache-dtype, --max-model-len, Hugging Face ids and config folders reach the run."""

import json
from pathlib import Path

from typer.testing import CliRunner

from kvsim.cli.app import app

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "traces" / "tiny.jsonl"
runner = CliRunner()

NATIVE = ["--gpu-mem-util", "0.8", "--max-batched-tokens", "4096", "--prefix-caching", "--chunked-prefill",
          "--tp", "2", "--swap-gib", "2", "--num-blocks", "500"]
VLLM = ["--gpu-memory-utilization", "0.8", "--max-num-batched-tokens", "4096", "--enable-prefix-caching",
        "--enable-chunked-prefill", "--tensor-parallel-size", "2", "--swap-space", "2",
        "--num-gpu-blocks-override", "501"]     # (vLLM counts its null block: 501 = 500 usable)


def run(tmp_path, name, *args):
    out = tmp_path / name
    res = runner.invoke(app, ["run", str(TINY), "--quiet", "--model", "llama-2-13b", "--out", str(out), *args])
    assert res.exit_code == 0, res.output
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("sim_wall_s")
    return json.loads((out / "config.json").read_text()), summary


def test_vllm_flag_names_equal_the_native_flags(tmp_path):
    native, vllm = run(tmp_path, "native", *NATIVE), run(tmp_path, "vllm", *VLLM)
    assert native == vllm
    config = native[0]
    assert config["deployment"]["tp"] == 2 and config["cache"]["num_blocks"] == 500
    assert config["cache"]["gpu_mem_util"] == 0.8 and config["cache"]["swap_gib"] == 2
    assert config["cache"]["prefix_caching"] and config["scheduler"]["chunked_prefill"]
    assert config["scheduler"]["max_batched_tokens"] == 4096
    default = run(tmp_path, "default")[0]
    # vLLM V1 caches prefixes unless told not to (issue 22 item 2): so does the vllm-v1 profile
    assert default["deployment"]["tp"] == 1 and default["cache"]["prefix_caching"]
    assert not run(tmp_path, "off", "--no-enable-prefix-caching")[0]["cache"]["prefix_caching"]
    assert not run(tmp_path, "2023", "--engine-profile", "vllm-2023")[0]["cache"]["prefix_caching"]
    assert run(tmp_path, "short-tp", "-tp", "2")[0]["deployment"]["tp"] == 2


def test_model_flags_reach_the_run(tmp_path):
    config, summary = run(tmp_path, "fp8", "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--kv-gib", "1",
                          "--kv-cache-dtype", "fp8", "--max-model-len", "1024")
    model = config["deployment"]["model"]
    assert model["name"] == "llama-3-8b" and model["kv_dtype_bytes"] == 1 and model["max_seq_len"] == 1024
    assert summary["kv"]["capacity_tokens"] == 2**30 // 65_536 == 16_384   # 1 GiB / 64 KiB per token
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 512,
        "intermediate_size": 512}))
    config, _ = run(tmp_path, "dir", "--model-config", str(tmp_path / "m"), "--kv-gib", "1")
    assert config["deployment"]["model"]["num_layers"] == 2


def test_bad_model_flags_are_one_line_errors():
    res = runner.invoke(app, ["run", str(TINY), "--kv-cache-dtype", "int3"])
    assert res.exit_code == 2 and "--kv-cache-dtype: unknown 'int3'" in res.output
    res = runner.invoke(app, ["run", str(TINY), "--max-model-len", "4096"])
    assert res.exit_code == 2 and "--max-model-len must be in [1, 2048]" in res.output


def test_max_model_len_limits_admission_and_the_max_reservation(tmp_path):
    # tiny.jsonl: prompt + output of 8, 16, 32, 35, 60, 72, 96, 105, 130 and 310 tokens
    _, summary = run(tmp_path, "len100", "--max-model-len", "100", "--kv-gib", "1")
    assert summary["requests_rejected"] == 3
    # contiguous `max` reserves --max-model-len slots per sequence: 400 slots hold 4 such reservations
    # (r2 has two samples), with 2048 none would fit
    args = ["--model", "opt-13b", "--allocator", "contiguous", "--reserve", "max", "--num-blocks", "25"]
    _, short = run(tmp_path, "short", *args, "--max-model-len", "100")
    assert short["requests_finished"] == 7 and short["kv"]["capacity_tokens"] == 400
