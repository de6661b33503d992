"""The sliding-window, chunked-local and MLA decode kernels against vLLM 0.33's own Triton kernels
(vllm_kernels.py).

Golden: vLLM's outputs for four small fp32 cases, stored in tests/data/vllm_kernels (made by
`PYTHONPATH=. python tests/gpu_harness/test_vllm_kernels_oracle.py`, which runs vLLM's kernels on the interpreter);
kvsim's kernels must match them. Live: where the oracle venv exists, vLLM's kernels are rerun and must
still give the stored values. Inputs come from a formula (sin of the element index), not a random
generator, so they are the same on every torch version.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
from pathlib import Path

import pytest
import torch

from gpu_harness import layout

GOLDEN = Path(__file__).parents[1] / "data" / "vllm_kernels" / "hybrid_decode_vllm_0.33.0.json.gz"
#: name: (kind, q_heads, kv_heads, head_dim or rank + rope, rank (MLA), block_size, seq_lens, window or chunk)
CASES = {
    "window W8 h8/2 d64 bs8": ("window", 8, 2, 64, 0, 8, (1, 7, 8, 9, 17, 40), 8),
    "window W20 h5/1 d64 bs16": ("window", 5, 1, 64, 0, 16, (5, 16, 21, 36, 65), 20),
    "chunk C8 h8/2 d64 bs4": ("chunk", 8, 2, 64, 0, 4, (1, 8, 9, 16, 17, 30), 8),
    "mla h16 r32+16 bs16": ("mla", 16, 1, 48, 32, 16, (1, 15, 16, 17, 40), 0),
}


def _values(shape, salt: float) -> torch.Tensor:
    n = math.prod(shape)
    return torch.sin(torch.arange(n, dtype=torch.float64) * 0.7548776662 + salt).float().reshape(shape)


def case_inputs(name: str):
    """(q, k_cache, v_cache, block_table, seq_lens, scale): fp32, block ids in reverse order behind a
    null block 0 (vLLM's null block, NaN-filled), which is the entry of every block wholly before the
    window (or the chunk)."""
    kind, hq, hk, d, rank, bs, lens, window = CASES[name]
    tables = layout.sequential_tables(lens, bs)
    nb = sum(map(len, tables))
    tables = [[nb - b for b in ids] for ids in tables]  # ids 1..nb, reversed; 0 is the null block
    if window:
        tables = layout.null_out_of_window(tables, lens, bs, window, null=0, chunked=kind == "chunk")
    k = _values((nb + 1, bs, hk, d), 0.1)
    v = _values((nb + 1, bs, hk, d), 0.2) * 2.0
    # vLLM's chunk_lookback path loads every block within C-1 positions of the query and masks after
    # the load, so a NaN there would poison its output (its Llama 4 layers use virtual batches instead,
    # which never see earlier blocks): that case's null block holds zeros
    k[0] = v[0] = 0.0 if kind == "chunk" else float("nan")
    q = _values((len(lens), hq, d), 0.3) * 1.5
    scale = 0.2 if kind == "mla" else d ** -0.5
    return q, k, v, layout.make_block_table(tables, "cpu"), layout.make_seq_lens(lens, "cpu"), scale


def ours(name: str, splits: int) -> torch.Tensor:
    from gpu_harness.kernels import mla_decode, paged_decode
    kind, _, _, _, rank, _, _, window = CASES[name]
    q, k, v, bt, sl, scale = case_inputs(name)
    if kind != "mla":
        return paged_decode(q, k, v, bt, sl, num_splits=splits, scale=scale, **{kind: window})
    return mla_decode(q, k[:, :, 0], bt, sl, kv_lora_rank=rank, scale=scale, num_splits=splits)


def vllms(name: str, kernels) -> torch.Tensor:
    """vLLM's output: unified_attention with window_size=(W-1, 0) (a chunk: window_size=(C-1, 0) with
    chunk_lookback=0, so chunk_size = C), or decode_attention_fwd(is_mla=True) with 2 KV splits, called
    as vLLM's Triton backends call them."""
    kind, hq, _, d, rank, bs, lens, window = CASES[name]
    q, k, v, bt, sl, scale = case_inputs(name)
    b = len(lens)
    if kind != "mla":
        out = torch.empty_like(q)
        cu_seqlens_q = torch.arange(b + 1, dtype=torch.int32)
        kernels.unified_attention(q, k, v, out, cu_seqlens_q, 1, sl, max(lens), scale, True, (window - 1, 0),
                                  bt, 0, None, None, None, chunk_lookback=0 if kind == "chunk" else -1)
        return out
    out = torch.zeros(b, hq, rank)
    lse = torch.zeros(b, hq)
    logits = torch.empty(b, hq, 2, rank + 1)
    cache = k  # [blocks, bs, 1, rank + rope]: one latent "head", as forward_mqa's unsqueeze(2)
    kernels.decode_attention_fwd(q, cache, cache[..., :rank], out, lse, bt, sl, logits, 2, scale, bs,
                                 is_mla=True)
    return out


def _golden() -> dict:
    with gzip.open(GOLDEN, "rt") as f:
        return json.load(f)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("splits", [1, 2])
def test_kernels_equal_vllms_stored_outputs(name, splits):
    doc = _golden()
    assert doc["vllm"] == "0.33.0"
    want = torch.tensor(doc["cases"][name]).reshape(ours(name, splits).shape)
    got = ours(name, splits)
    assert not got.isnan().any()  # the NaN null block (window, MLA) was not read
    torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5)


# vLLM's unified kernel divides 0 by 0 in the padded query rows of its BLOCK_M tile (rows it never
# stores); numpy, under the interpreter, warns about it
@pytest.mark.filterwarnings("ignore:invalid value encountered in divide:RuntimeWarning")
@pytest.mark.long
@pytest.mark.parametrize("name", list(CASES))
def test_vllm_kernels_live_still_give_the_stored_outputs(name):
    from tests.gpu_harness import vllm_kernels
    reason = vllm_kernels.available()
    if reason:
        pytest.skip(reason)
    live = vllms(name, vllm_kernels.load())
    torch.testing.assert_close(live.flatten(), torch.tensor(_golden()["cases"][name]), atol=1e-6, rtol=1e-6)


def test_golden_values_are_not_trivial():
    # finite, not near zero, and the window matters: attention over every token differs from vLLM's
    from gpu_harness import reference
    doc = _golden()["cases"]
    for name in CASES:
        assert all(math.isfinite(x) for x in doc[name]) and max(map(abs, doc[name])) > 0.1
    for name in ("window W8 h8/2 d64 bs8", "window W20 h5/1 d64 bs16", "chunk C8 h8/2 d64 bs4"):
        q, k, v, _, sl, scale = case_inputs(name)
        lens, bs = CASES[name][6], CASES[name][5]
        nb = sum(layout.blocks_needed(n, bs) for n in lens)
        every_block = [[nb - b for b in ids] for ids in layout.sequential_tables(lens, bs)]
        unwindowed = reference.ref_paged_decode(q, k, v, layout.make_block_table(every_block, "cpu"), sl, scale)
        assert (unwindowed.flatten() - torch.tensor(doc[name])).abs().max() > 0.05


if __name__ == "__main__":  # regenerate the golden file from vLLM's kernels (needs the oracle venv)
    sys.path.insert(0, str(Path(__file__).parent))
    from gpu_harness.backend import get_backend
    get_backend()
    import vllm_kernels
    kernels = vllm_kernels.load()
    cases = {name: [float(f"{x:.8g}") for x in vllms(name, kernels).flatten().tolist()] for name in CASES}
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(GOLDEN, "wt") as f:
        json.dump({"vllm": "0.33.0", "cases": cases}, f)
    print(f"wrote {GOLDEN}")
