"""`kvsim harness bench-hybrid` on the interpreter: the points it times and the bytes model, by hand."""

import json

from typer.testing import CliRunner

from gpu_harness import bench
from gpu_harness.cli import harness_app


def test_bytes_models_by_hand():
    # window 8 over context 48 reads 8 tokens: K+V 2 x 2 seqs x 8 x 2 heads x 64 x 2 B = 8,192, Q+O
    # 2 x 2 x 4 heads x 64 x 2 B = 2,048, table 4 B x 2 x ceil(8 / 8) = 8
    assert bench.window_decode_bytes(2, 48, 8, 4, 2, 64, 2, 8, 1) == 8_192 + 2_048 + 8
    assert bench.window_decode_bytes(2, 5, 8, 4, 2, 64, 2, 8, 1) == bench.decode_bytes(2, 5, 4, 2, 64, 2, 8, 1)
    # MLA, 2 seqs x 16 tokens, 16 heads, rank 32 + rope 16, bf16, block 8: rows 2 x 16 x 48 x 2 = 3,072;
    # q in 2 x 16 x 48 x 2 = 3,072 and latent out 2 x 16 x 32 x 2 = 2,048; table 4 x 2 x 2 = 16;
    # with 4 splits, fp32 partials 2 x 2 x 16 x 4 x 33 x 4 = 33,792
    assert bench.mla_decode_bytes(2, 16, 16, 32, 16, 2, 8, 1) == 3_072 + 3_072 + 2_048 + 16
    assert bench.mla_decode_bytes(2, 16, 16, 32, 16, 2, 8, 4) == 3_072 + 3_072 + 2_048 + 16 + 33_792


def test_bench_hybrid_command_writes_measurements(tmp_path):
    out = tmp_path / "hybrid.json"
    result = CliRunner().invoke(harness_app, ["bench-hybrid", "--out", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["backend"] == "interpreter" and doc["dtype"] == "bfloat16"
    points = [(m["kernel"], m["shape"], m["context"], m["window"], m["chunk"]) for m in doc["measurements"]]
    assert points == [("paged_decode", "tiny-window", 16, None, None), ("window_decode", "tiny-window", 16, 8, None),
                      ("paged_decode", "tiny-window", 48, None, None), ("window_decode", "tiny-window", 48, 8, None),
                      ("paged_decode", "tiny-chunk", 16, None, None), ("chunk_decode", "tiny-chunk", 16, None, 16),
                      ("paged_decode", "tiny-chunk", 48, None, None), ("chunk_decode", "tiny-chunk", 48, None, 16),
                      ("mla_decode", "tiny-mla", 16, None, None), ("mla_decode", "tiny-mla", 48, None, None)]
    by = {(m["kernel"], m["context"]): m for m in doc["measurements"] if m["shape"] != "tiny-chunk"}
    # full attention over 48 tokens: K+V 2 x 2 x 48 x 2 x 64 x 2 = 49,152 + Q/O 2,048 + table 4 x 2 x 6 = 48
    assert by[("paged_decode", 48)]["bytes"] == 49_152 + 2_048 + 48
    # the window reads 8 of them, in one block per sequence
    assert by[("window_decode", 48)]["bytes"] == 8_192 + 2_048 + 8
    # chunks of 16 (block 8): L 48 attends to [32, 48), 16 tokens in 2 blocks; L 16 to all 16 of [0, 16)
    chunk = {m["context"]: m["bytes"] for m in doc["measurements"] if m["kernel"] == "chunk_decode"}
    assert chunk == {48: 16_384 + 2_048 + 16, 16: 16_384 + 2_048 + 16}
    assert all(m["splits"] == 1 and m["median_s"] > 0 for m in doc["measurements"])
    assert all(abs(m["bytes_per_s"] * m["median_s"] - m["bytes"]) < 1e-6 * m["bytes"] for m in doc["measurements"])
