"""The default cost model against Vidur's real A100/H100 profiles (../shared/calibration/vidur-profiles).

Each check predicts one layer's operator time with the default constants and compares it with the
measured median; docs/cost-model.md states the same ratios. Skipped when the profiles are absent.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from kvsim.cost.roofline import CostModel
from kvsim.specs import Deployment, ModelSpec, get_gpu

PROFILES = Path(__file__).resolve().parents[3] / "shared" / "calibration" / "vidur-profiles"
GPU_OF_PREFIX = {"a100": "a100-80gb", "h100": "h100-80gb"}   # Vidur profiled SXM 80 GB parts
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_act", "mlp_down_proj")
MLP_FILES = sorted(p.name for p in PROFILES.glob("*_mlp.csv")) if PROFILES.is_dir() else []

pytestmark = pytest.mark.skipif(not PROFILES.is_dir(), reason="../shared/calibration/vidur-profiles (Vidur's "
                                "measured profiles, not part of the repository) is absent; docs/cost-model.md "
                                "records the ratios they gave")


def layer_model(name: str, n_embd: int, n_head: int, n_kv_head: int, n_expanded_embd: int) -> ModelSpec:
    """One gated-MLP LLaMA layer as a ModelSpec (no embeddings: every parameter is a linear weight)."""
    head_dim = n_embd // n_head
    params = 2 * n_embd * n_embd + 2 * n_embd * n_kv_head * head_dim + 3 * n_embd * n_expanded_embd
    return ModelSpec(name, 1, n_embd, n_head, n_kv_head, head_dim, 2, 4096, float(params))


def linear_ratios(file_name: str) -> pd.DataFrame:
    """Per (tp, num_tokens): measured and predicted seconds of one layer's linear operators, and ratio."""
    df = pd.read_csv(PROFILES / file_name)
    df["measured_s"] = sum(df[f"time_stats.{op}.median"] for op in LINEAR_OPS) / 1e3
    df = df.groupby(["num_tensor_parallel_workers", "num_tokens"], as_index=False)["measured_s"].median()
    shape = pd.read_csv(PROFILES / file_name, nrows=1).iloc[0]
    model = layer_model(file_name, int(shape.n_embd), int(shape.n_head), int(shape.n_kv_head),
                        int(shape.n_expanded_embd))
    gpu = get_gpu(GPU_OF_PREFIX[file_name.split("_")[0]])
    costs = {tp: CostModel(Deployment(model, gpu, int(tp)), 16, paged=False)
             for tp in df.num_tensor_parallel_workers.unique()}
    df["predicted_s"] = [costs[tp].linear_time(int(n))
                         for tp, n in zip(df.num_tensor_parallel_workers, df.num_tokens)]
    df["ratio"] = df.predicted_s / df.measured_s
    return df


def attention_ratios() -> pd.DataFrame:
    """Llama-2-7B A100 attention anchors: measured and predicted seconds per layer (paged, block 16)."""
    df = pd.read_csv(PROFILES / "a100_meta-llama_Llama-2-7b-hf_attention_anchors.csv")
    cost = CostModel(Deployment(layer_model("llama-2-7b-layer", 4096, 32, 32, 11008), get_gpu("a100-80gb")),
                     16, paged=True)
    chunk = df.prefill_chunk_size.fillna(0).astype(int)
    df["predicted_s"] = [
        cost.decode_attention_time(b, b * kv) if kind == "decode" else cost.prefill_attention_time(c * (kv + c))
        for kind, b, c, kv in zip(df.kind, df.batch_size, chunk, df.kv_cache_size)]
    df["ratio"] = df.predicted_s / (df.median_ms / 1e3)
    return df


def all_reduce_ratios() -> pd.DataFrame:
    """A100 2-GPU NVLink all-reduce: measured and predicted seconds of one all-reduce, by size (bytes)."""
    df = pd.read_csv(PROFILES / "a100_pairwise_nvlink_all_reduce.csv")
    df = df[df.num_workers == 2].groupby("size", as_index=False)["time_stats.all_reduce.median"].median()
    hidden = 1024                                       # one token = 2 KiB of bf16 activations
    cost = CostModel(Deployment(layer_model("ar", hidden, 8, 8, 4 * hidden), get_gpu("a100-80gb"), 2),
                     16, paged=False)
    tokens = (df["size"] / (2 * hidden)).round().astype(int)
    df["predicted_s"] = [cost.all_reduce_time(int(n)) / 2 for n in tokens]   # two per layer
    df["ratio"] = df.predicted_s / (df["time_stats.all_reduce.median"] / 1e3)
    return df


@pytest.mark.parametrize("file_name", MLP_FILES)
def test_linear_layers_within_band_of_profile(file_name):
    """Every (tp, tokens) point within 0.55-1.5x of the measured linear-operator time (measured:
    0.60-1.16), the median within 0.85-1.15 (measured 0.88-1.03)."""
    df = linear_ratios(file_name)
    assert df.ratio.between(0.55, 1.5).all(), df.loc[~df.ratio.between(0.55, 1.5)].to_string()
    assert 0.85 <= df.ratio.median() <= 1.15


@pytest.mark.parametrize("file_name", MLP_FILES)
def test_linear_layers_tight_at_large_single_gpu_batches(file_name):
    """At >= 1024 tokens on one GPU the GEMMs are compute bound and the roofline is within 20 %
    (measured 0.83-1.09)."""
    df = linear_ratios(file_name)
    big = df[(df.num_tokens >= 1024) & (df.num_tensor_parallel_workers == 1)]
    assert len(big) > 10
    assert big.ratio.between(0.8, 1.2).all(), big.loc[~big.ratio.between(0.8, 1.2)].to_string()


def test_prefill_attention_within_band_of_anchors():
    """Prefill anchors (chunk 256-2624, context up to 3840): within 0.8-1.25x (measured 0.86-1.05)."""
    df = attention_ratios()
    prefill = df[df.kind == "prefill"]
    assert len(prefill) == 21
    assert prefill.ratio.between(0.8, 1.25).all(), prefill.to_string()


def test_paged_decode_attention_gap_to_anchors():
    """Decode anchors (batch 1-128, context 32-2560), paged block 16: the default is slower than this
    2024 kernel by about the paper's 2023 paged overhead (1.23); every point within 2x, median 1.1-1.4
    (measured 0.89-1.44, median 1.24)."""
    decode = attention_ratios().query("kind == 'decode'")
    assert len(decode) == 28
    assert decode.ratio.between(0.5, 2.0).all(), decode.to_string()
    assert 1.1 <= decode.ratio.median() <= 1.4


def test_all_reduce_within_band_of_nvlink_profile():
    """All-reduces of 1 MB and more (a token batch of 64+ at hidden 8192) within 0.6-1.4x (measured
    0.63-1.29); smaller ones are noisy (7-64 us) and not asserted."""
    df = all_reduce_ratios()
    large = df[df["size"] >= 1e6]
    assert len(large) > 1000
    assert large.ratio.between(0.6, 1.4).all(), large.loc[~large.ratio.between(0.6, 1.4)].to_string()
