"""The planning arithmetic at its edges, worked by hand (issue 22 items 3 and 8): the memory ledger of one
model on one GPU, an SLO met exactly at its limit, replicas for a rate that is not a whole multiple of
one replica's, quantization configs, and a request of exactly --max-model-len tokens."""

import json

import pytest

import kvsim
from kvsim.planning.rate import search as rt
from kvsim.planning.rate import gpus as rate_gpus
from kvsim.planning.reports.ledger import ledger_lines, memory_ledger
from kvsim.planning.runs import make_config
from kvsim.specs import GIB
from kvsim.specs.hf.config import load_hf_config, weight_bytes_per_param


def test_memory_ledger_of_llama_3_8b_on_an_h100_by_hand():
    """Llama-3-8B (8.03e9 bf16 weights) on one H100 (79.22 GiB as the device reports it) at 0.9:
    budget 71.298 GiB; weights 16.06e9 B = 14.957 GiB; activation peak 8192 tokens x 20 x 4096 x 2 B
    = 1.25 GiB; non-torch 0.5 GiB; KV 71.298 - 14.957 - 1.25 - 0.5 = 54.591 GiB. 128 KiB per token
    (2 x 32 layers x 8 KV heads x 128 x 2 B): floor(54.591 GiB / 128 KiB) = 447,209 tokens, 27,950
    whole blocks of 16 = 447,200 tokens; 447,200 / 8192 = 54.59x concurrency at the maximum length."""
    g = memory_ledger(make_config(model="llama-3-8b", gpu="h100-80gb"))
    weights = 8.03e9 * 2 / GIB
    assert g["budget_gib"] == pytest.approx(0.9 * 79.22, abs=1e-8)
    assert g["model_weights_gib"] == pytest.approx(weights) and g["activation_peak_gib"] == 1.25
    assert g["non_torch_memory_gib"] == 0.5
    assert g["rest_for_kv_cache_gib"] == pytest.approx(0.9 * 79.22 - weights - 1.75, abs=1e-8)
    kv_tokens = int((0.9 * int(79.22 * GIB) - 8.03e9 * 2 - 1.75 * GIB) // 131072)
    assert kv_tokens == 447_209
    assert g["kv_cache_tokens"] == 447_200 and g["num_blocks"] == 27_950
    assert g["max_concurrency"] == pytest.approx(447_200 / 8192)
    lines = ledger_lines(g)[1:]         # (after the scheduler's limits: tests/engine/batching/test_defaults.py)
    assert lines[0] == "Model loading took 14.96 GiB memory (weights per GPU, TP 1)"
    assert "model weights take 14.96GiB; non_torch_memory takes 0.50GiB; PyTorch activation peak memory " \
           "takes 1.25GiB; the rest of the memory reserved for KV Cache is 54.59GiB." in lines[1]
    assert lines[-2:] == ["GPU KV cache size: 447,200 tokens (27,950 blocks of 16)",
                          "Maximum concurrency for 8,192 tokens per request: 54.59x"]


def test_ledger_splits_weights_over_tp_and_names_a_given_kv_size():
    """Llama-2-70B (69e9 bf16) on 4 A100-80GB: 69e9 x 2 / 4 B = 32.13 GiB of weights per GPU. With
    --kv-gib 20 the KV cache is 20 / 4 = 5 GiB per GPU whatever the budget leaves."""
    g = memory_ledger(make_config(model="llama-2-70b", gpu="a100-80gb", tp=4, kv_gib=20))
    assert g["model_weights_gib"] == pytest.approx(69e9 * 2 / 4 / GIB)
    assert g["kv_cache_gib"] == pytest.approx(5.0, rel=1e-4) and g["kv_cache_source"] == "kv_gib"
    assert "(set by --kv-gib)" in ledger_lines(g)[3]
    tp1 = memory_ledger(make_config(model="llama-2-70b", gpu="a100-80gb"))
    assert tp1["kv_cache_tokens"] is None and "weights leave no memory" in tp1["kv_error"]


def test_an_slo_met_exactly_at_its_limit_is_met():
    """`--slo ttft_p99=2` means p99 TTFT <= 2 s: a run at exactly 2 s meets it, one a nanosecond over
    does not (rate.meets, the README's SLO section)."""
    row = {"status": "ok", "ttft_s_p99": 2.0, "normalized_latency_s_per_token": 0.05}
    assert rt.meets(row, {"ttft_p99": 2.0}) and rt.meets(row, {"normalized_latency": 0.05})
    assert not rt.meets({**row, "ttft_s_p99": 2.0 + 1e-9}, {"ttft_p99": 2.0})
    assert not rt.meets({**row, "status": "error"}, {"ttft_p99": 2.0})


@pytest.mark.parametrize("rate, replicas", [(2.0, 2), (2.5, 3), (0.4, 1), (3.01, 4)])
def test_replicas_round_up(monkeypatch, rate, replicas):
    """One TP-1 replica serves 1 req/s under the SLO: 2 req/s take 2 replicas, 2.5 take 3 (never 2.5
    rounded down), 0.4 one, 3.01 four."""
    def one_per_s(slo, cfg, **kw):
        return rt.RateResult(1.0, dict(slo), [], "kv_memory")
    monkeypatch.setattr(rate_gpus, "max_rate", one_per_s)
    df = rate_gpus.gpus_for_rate(rate, {"ttft_p99": 2}, tp_options=[1], model="opt-13b", gpu="a100-40gb")
    assert df.replicas.tolist() == [replicas] and df.gpus.tolist() == [replicas]


@pytest.mark.parametrize("quant, per_weight", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 0.5),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0),
    ({"quant_method": "fp8"}, 1.0),
    ({"quant_method": "awq", "bits": 4, "group_size": 128}, 0.5 + 2.5 / 128),
    ({"quant_method": "gptq", "bits": 8, "group_size": 64}, 1.0 + 3.0 / 64),
    ({"quant_method": "gptq", "bits": 4, "group_size": -1}, 0.5),
    ({"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 8}}}}, 1.0),
])
def test_quantized_hf_configs(tmp_path, quant, per_weight):
    """2 layers, hidden 256, 4 heads, MLP 512 (gated), vocab 1000 untied: linear weights 2 x (4 x 256^2
    + 3 x 256 x 512) = 1,310,720 at `per_weight` bytes; embeddings 2 x 1000 x 256 in bf16."""
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "max_position_embeddings": 512,
        "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16", "quantization_config": quant}))
    assert weight_bytes_per_param(quant, "x") == pytest.approx(per_weight)
    spec = load_hf_config(tmp_path)
    assert spec.weight_bytes == pytest.approx(1_310_720 * per_weight + 2 * 1000 * 256 * 2)


def test_a_request_of_exactly_max_model_len_is_served_one_more_is_rejected(tmp_path):
    """vLLM refuses prompt + max_tokens > max_model_len; exactly max_model_len is served."""
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "prompt_tokens": 900, "output_tokens": 124}\n'
                     '{"arrival_s": 0.1, "prompt_tokens": 900, "output_tokens": 125}\n')
    s = kvsim.simulate(trace, model="llama-3-8b", kv_gib=1, max_model_len=1024).summary
    assert s["requests_finished"] == 1 and s["requests_rejected"] == 1
