"""Readers for Azure, Mooncake and Vidur traces, format detection, and the shared real traces."""

from pathlib import Path

import numpy as np
import pytest

from kvsim.trace.table import TraceError
from kvsim.trace.formats import detect_format, load_trace, read_trace

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "traces"
#: The first rows of each shared trace, shipped so a clean checkout tests every real format.
HEADS = Path(__file__).resolve().parents[1] / "data" / "shared_traces_head"
NO_SHARED = ("../shared/traces (the full real traces) is absent, as in a clean checkout; their first rows in "
             "tests/data/shared_traces_head are tested instead")


def write(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    return tmp_path / name


def test_azure_csv(tmp_path):
    p = write(tmp_path, "az.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
              "2023-11-16 18:17:03.9799600,4808,10\n2023-11-16 18:17:04.0319600,3180,0\n"
              "2023-11-16 18:18:03.9799600,110,27\n")
    assert detect_format(p) == "azure"
    t, report = read_trace(p)
    np.testing.assert_allclose(t.arrival_s, [0.0, 0.052, 60.0])
    assert t.prompt_tokens.tolist() == [4808, 3180, 110] and t.output_tokens.tolist() == [10, 1, 27]
    assert report.zero_output_clamped == 1 and report.requests == 3


def test_azure_errors_name_line_and_field(tmp_path):
    head = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9,10,1\n"
    with pytest.raises(TraceError, match=r"az\.csv:3: field 'ContextTokens' must be a finite number >= 0, got '-4'"):
        read_trace(write(tmp_path, "az.csv", head + "2023-11-16 18:17:04.0,-4,1\n"))
    with pytest.raises(TraceError, match=r"az\.csv:3: field 'TIMESTAMP' must be a datetime, got 'yesterday'"):
        read_trace(write(tmp_path, "az.csv", head + "yesterday,4,1\n"))
    with pytest.raises(TraceError, match=r"az\.csv:3: field 'TIMESTAMP' must be non-decreasing"):
        read_trace(write(tmp_path, "az.csv", head + "2023-11-16 18:17:02.0,4,1\n"))
    with pytest.raises(TraceError, match=r"az\.csv:3: field 'GeneratedTokens' must be an integer >= 0 \(tokens\)"):
        read_trace(write(tmp_path, "az.csv", head + "2023-11-16 18:17:04.0,4,1.5\n"))
    with pytest.raises(TraceError, match=r"x\.csv:1: missing column 'GeneratedTokens'"):
        read_trace(write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,4\n"), "azure")


def test_mooncake_jsonl(tmp_path):
    p = write(tmp_path, "mc.jsonl",
              '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
              '{"timestamp": 1500, "input_length": 600, "output_length": 0, "hash_ids": [0, 3]}\n')
    assert detect_format(p) == "mooncake"
    t, report = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 1.5] and t.hash_block_size == 512
    assert t.block_hashes(0).tolist() == [0, 1, 2] and report.zero_output_clamped == 1
    assert t.prompt_block_ids(0, 512) == [0, 1] and t.prompt_block_ids(0, 16)[:32] == t.prompt_block_ids(1, 16)[:32]


def test_mooncake_errors(tmp_path):
    with pytest.raises(TraceError, match=r"mc\.jsonl:1: field 'hash_ids' has 3 entries, more than the 2 blocks"):
        read_trace(write(tmp_path, "mc.jsonl", '{"timestamp": 0, "input_length": 600, "output_length": 5, '
                         '"hash_ids": [0, 1, 2]}\n'))
    with pytest.raises(TraceError, match=r"mc\.jsonl:2: field 'timestamp' must be non-decreasing"):
        read_trace(write(tmp_path, "mc.jsonl", '{"timestamp": 9, "input_length": 6, "output_length": 5}\n'
                         '{"timestamp": 3, "input_length": 6, "output_length": 5}\n'))
    with pytest.raises(TraceError, match=r"mc\.jsonl:1: missing required field 'output_length'"):
        read_trace(write(tmp_path, "mc.jsonl", '{"timestamp": 0, "input_length": 6}\n'), "mooncake")


def test_vidur_csv_with_and_without_timestamps(tmp_path):
    p = write(tmp_path, "sw.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n10.5,100,20\n11.0,50,3\n")
    assert detect_format(p) == "vidur"
    t, _ = read_trace(p)
    assert t.arrival_s.tolist() == [0.0, 0.5] and t.prompt_tokens.tolist() == [100, 50]
    q = write(tmp_path, "len.csv", "num_prefill_tokens,num_decode_tokens,pd_ratio\n100,20,5\n50,3,1\n7,9,1\n")
    t, report = read_trace(q)
    assert t.arrival_s.tolist() == [0.0, 0.0, 0.0] and report.arrivals == "all 0"
    a, _ = read_trace(q, rate=4.0, seed=3)
    b, _ = read_trace(q, rate=4.0, seed=3)
    assert np.all(np.diff(a.arrival_s) >= 0) and a.arrival_s[0] > 0 and a.arrival_s.tolist() == b.arrival_s.tolist()
    with pytest.raises(TraceError, match="rate applies only to files without timestamps"):
        read_trace(p, rate=4.0)


def test_unknown_layouts_are_rejected(tmp_path):
    with pytest.raises(TraceError, match=r"u\.csv:1: CSV columns \['a', 'b'\] match no format"):
        detect_format(write(tmp_path, "u.csv", "a,b\n1,2\n"))
    with pytest.raises(TraceError, match=r"u\.jsonl:1: fields \['x'\] match no format"):
        detect_format(write(tmp_path, "u.jsonl", '{"x": 1}\n'))
    with pytest.raises(ValueError, match="unknown format 'parquet'"):
        read_trace(write(tmp_path, "u.jsonl", '{"x": 1}\n'), "parquet")


SHARED_FILES = {  # file: (format, requests)
    "azure_llm_2023_code.csv": ("azure", 8819),
    "azure_llm_2023_conv.csv": ("azure", 19366),
    "mooncake_conversation.jsonl": ("mooncake", 12031),
    "mooncake_synthetic.jsonl": ("mooncake", 3993),
    "arxiv_summarization_lengths.csv": ("vidur", 28257),
}


@pytest.mark.skipif(not SHARED.is_dir(), reason=NO_SHARED)
@pytest.mark.parametrize("name", sorted(SHARED_FILES))
def test_every_shared_trace_converts(name, tmp_path):
    from kvsim.trace.jsonl import read_jsonl, write_jsonl
    fmt, rows = SHARED_FILES[name]
    assert detect_format(SHARED / name) == fmt
    t, report = read_trace(SHARED / name)
    assert len(t) == rows and report.format == fmt
    assert t.arrival_s[0] == 0.0 and np.all(np.diff(t.arrival_s) >= 0)
    write_jsonl(t, tmp_path / "out.jsonl")
    back = load_trace(tmp_path / "out.jsonl", hash_block_size=t.hash_block_size)
    np.testing.assert_array_equal(back.prompt_tokens, t.prompt_tokens)
    np.testing.assert_array_equal(back.arrival_s, t.arrival_s)
    if fmt == "mooncake":
        assert back.prompt_block_ids(5, 16) == t.prompt_block_ids(5, 16) != []


@pytest.mark.skipif(not SHARED.is_dir(), reason=NO_SHARED)
def test_shared_azure_conv_matches_its_readme():
    s = load_trace(SHARED / "azure_llm_2023_conv.csv").summary()
    assert round(s["prompt_tokens"]["mean"]) == 1155 and s["output_tokens"]["max"] == 1000
    assert 5.4 < s["rate_rps"] < 5.6


HEAD_ROWS = {"azure_llm_2023_code.csv": 50, "azure_llm_2023_conv.csv": 200, "mooncake_conversation.jsonl": 30,
             "mooncake_synthetic.jsonl": 5, "arxiv_summarization_lengths.csv": 50}   # `head -n` of each


@pytest.mark.parametrize("name", sorted(HEAD_ROWS))
def test_the_shipped_head_of_every_shared_trace_converts(name):
    """Format detection and the first request against the raw first row, read here without kvsim."""
    import csv
    import json
    fmt = SHARED_FILES[name][0]
    path = HEADS / name
    assert detect_format(path) == fmt
    t, report = read_trace(path)
    assert len(t) == HEAD_ROWS[name] and report.format == fmt and t.arrival_s[0] == 0.0
    if name.endswith(".csv"):
        first = next(csv.DictReader(path.open()))
        prompt = first.get("ContextTokens") or first["num_prefill_tokens"]
        output = first.get("GeneratedTokens") or first["num_decode_tokens"]
    else:
        first = json.loads(path.open().readline())
        prompt, output = first["input_length"], first["output_length"]
    assert (t.prompt_tokens[0], t.output_tokens[0]) == (int(prompt), int(output))


def test_mooncake_hash_ids_in_kvsim_jsonl_are_read_as_512_token_blocks(tmp_path):
    from pathlib import Path
    from kvsim.trace.jsonl import read_jsonl
    excerpt = Path(__file__).parents[2] / "traces" / "mooncake_conversation_excerpt.jsonl"
    t = read_jsonl(excerpt)
    assert t.hash_block_size == 512                      # 6758 tokens, 14 hashes: ceil(6758 / 512)
    assert len(t.prompt_block_ids(0, 16)) == 6758 // 16  # each hash splits into 32 blocks of 16
    assert read_jsonl(excerpt, hash_block_size=16).hash_block_size == 16     # an explicit size wins
    short = tmp_path / "short.jsonl"                     # hashes per 16-token block: left alone
    short.write_text('{"arrival_s": 0, "prompt_tokens": 1100, "output_tokens": 3, "block_hashes": '
                     + str(list(range(68))) + '}\n')
    assert read_jsonl(short).hash_block_size is None
