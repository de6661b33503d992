"""Azure, Vidur and Mooncake readers and format detection at their edges: what is accepted (leading
spaces, a byte-order mark, equal timestamps, mixed timestamp precision, blank lines) and the exact
message, naming file, line and field, for everything refused."""

import re

import numpy as np
import pytest

from kvsim.trace import jsonl as trace_jsonl
from kvsim.trace.table import Trace, TraceError
from kvsim.trace.formats import detect_format, load_trace, read_trace

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
JSONL_ROW = '{"arrival_s": 0, "prompt_tokens": 600, "output_tokens": 1, "block_hashes": [1, 2]}\n'


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def refused(path, message):
    """TraceError whose message is exactly `message` with {p} standing for the path."""
    return pytest.raises(TraceError, match="^" + re.escape(message.format(p=path)) + "$")


@pytest.mark.parametrize("first_line, fmt", [
    ('   {"arrival_s": 0, "prompt_tokens": 3, "output_tokens": 1}', "jsonl"),   # leading spaces
    ('{"arrival_s": 0}', "jsonl"),
    ('{"prompt_tokens": 3}', "jsonl"),
    ('{"timestamp": 0, "hash_ids": [1]}', "mooncake"),
    ('{"input_length": 3}', "mooncake"),
    ("num_prefill_tokens,num_decode_tokens", "vidur"),                           # exactly the columns
    ("TIMESTAMP, ContextTokens, GeneratedTokens", "azure"),
])
def test_detection_by_first_line(tmp_path, first_line, fmt):
    assert detect_format(write(tmp_path, "t.txt", "\n" + first_line + "\n")) == fmt


@pytest.mark.parametrize("text, message", [
    ("\n\n", "{p}:1: empty file, no requests"),
    ('\n{"arrival_s": 0, "arrival_s": 1}\n', "{p}:2: field 'arrival_s' appears twice in one request"),
    ("{oops\n", "{p}:1: malformed JSON, cannot detect the format"),
    ('{"x": 1, "a": 2}\n', "{p}:1: fields ['a', 'x'] match no format; expected 'arrival_s'/'prompt_tokens' "
                           "(jsonl) or 'input_length' (mooncake)"),
    ("a,b\n", "{p}:1: CSV columns ['a', 'b'] match no format; expected TIMESTAMP,ContextTokens,"
              "GeneratedTokens (azure) or num_prefill_tokens,num_decode_tokens (vidur)"),
])
def test_detection_errors(tmp_path, text, message):
    path = write(tmp_path, "t.txt", text)
    with refused(path, message):
        detect_format(path)


def test_read_trace_argument_errors(tmp_path):
    jsonl = write(tmp_path, "t.jsonl", JSONL_ROW)
    with pytest.raises(ValueError, match=re.escape("unknown format 'csv'; known: auto, jsonl, azure, mooncake, vidur")):
        read_trace(jsonl, "csv")
    with refused(jsonl, "{p}: rate applies only to files without timestamps (vidur lengths files)"):
        read_trace(jsonl, rate=1.0)
    with refused(jsonl, "{p}:1: missing required field 'timestamp'"):
        load_trace(jsonl, "mooncake")                    # the format given is the one read


def test_jsonl_through_read_trace_and_load_trace(tmp_path):
    jsonl = write(tmp_path, "t.jsonl", JSONL_ROW + JSONL_ROW)
    trace, report = read_trace(jsonl, hash_block_size=512)
    assert (report.source, report.format, report.requests, report.arrivals) == ("t.jsonl", "jsonl", 2,
                                                                               "from the file")
    assert trace.hash_block_size == 512
    assert load_trace(jsonl, hash_block_size=300).hash_block_size == 300
    assert load_trace(jsonl).hash_block_size is None and len(load_trace(jsonl)) == 2


def test_azure_with_bom_spaces_equal_and_mixed_precision_timestamps(tmp_path):
    """Times 0, 0 (equal: allowed), 0.5 and 60 s; whole seconds next to 7-digit fractions."""
    path = write(tmp_path, "az.csv", b"\xef\xbb\xbf" + (
        "TIMESTAMP, ContextTokens, GeneratedTokens\n"
        "2023-11-16 18:17:03, 10, 2\n2023-11-16 18:17:03, 20, 0\n"
        "2023-11-16 18:17:03.5000000, 0, 4\n2023-11-16 18:18:03, 40, 5\n").encode())
    trace, report = read_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.0, 0.5, 60.0]
    assert trace.prompt_tokens.tolist() == [10, 20, 1, 40] and trace.output_tokens.tolist() == [2, 1, 4, 5]
    assert trace.source == "az.csv"
    assert report == type(report)("az.csv", "azure", 4, 1, 1, "from the file")


@pytest.mark.parametrize("rows, message", [
    ("2023-11-16 18:17:05,1,1\n2023-11-16 18:17:06,1,1\n2023-11-16 18:17:04,1,1\n",
     "{p}:4: field 'TIMESTAMP' must be non-decreasing, got -1.000000 s after 1.000000 s (from the first row)"),
    ("", "{p}:2: no requests"),
    ('2023-11-16 18:17:05,"1,1\n', "{p}: unreadable CSV: Error tokenizing data. C error: EOF inside string "
                                  "starting at row 1"),
])
def test_azure_errors(tmp_path, rows, message):
    path = write(tmp_path, "az.csv", AZURE + rows)
    with refused(path, message):
        read_trace(path)


def test_csv_errors_name_columns_and_bytes(tmp_path):
    path = write(tmp_path, "x.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03,4\n")
    with refused(path, "{p}:1: missing column 'GeneratedTokens' (expected TIMESTAMP,ContextTokens,"
                       "GeneratedTokens)"):
        read_trace(path, "azure")
    latin = write(tmp_path, "l.csv", (AZURE + "2023-11-16 18:17:03,4,1\n2023-11-16 18:17:04,4,1\ncafé,1,1\n")
                  .encode("latin-1"))
    with refused(latin, "{p}:4: not UTF-8 text (byte 0xe9 at column 4); kvsim reads UTF-8 traces"):
        read_trace(latin, "azure")
    empty = write(tmp_path, "e.csv", "")
    with refused(empty, "{p}: unreadable CSV: No columns to parse from file"):
        read_trace(empty, "vidur")


def test_vidur_arrivals_and_their_errors(tmp_path):
    path = write(tmp_path, "sw.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n2.5,100,20\n2.5,50,3\n")
    assert read_trace(path)[0].arrival_s.tolist() == [0.0, 0.0]
    bad = write(tmp_path, "bad.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1,100,20\nsoon,5,3\n")
    with refused(bad, "{p}:3: field 'arrived_at' must be a finite number >= 0, got 'soon'"):
        read_trace(bad)
    with refused(path, "{p}:1: rate applies only to files without timestamps (this one has 'arrived_at')"):
        read_trace(path, "vidur", rate=2.0)


def test_poisson_arrivals_default_to_seed_0(tmp_path):
    lengths = write(tmp_path, "len.csv", "num_prefill_tokens,num_decode_tokens\n100,20\n50,3\n7,9\n")
    default, report = read_trace(lengths, rate=4.0)
    assert report.arrivals == "Poisson, 4 req/s, seed 0"
    assert default.arrival_s.tolist() == read_trace(lengths, rate=4.0, seed=0)[0].arrival_s.tolist()
    assert default.arrival_s.tolist() != read_trace(lengths, rate=4.0, seed=1)[0].arrival_s.tolist()
    assert load_trace(lengths, rate=4.0).arrival_s.tolist() == default.arrival_s.tolist()
    assert load_trace(lengths, rate=4.0, seed=1).arrival_s.tolist() == \
        read_trace(lengths, rate=4.0, seed=1)[0].arrival_s.tolist()
    assert load_trace(lengths).arrival_s.tolist() == [0.0, 0.0, 0.0]


def test_mooncake_blank_lines_equal_timestamps_and_offset_start(tmp_path):
    """Timestamps 1000, 1000 and 2500 ms become 0, 0 and 1.5 s; an input length (600) below the previous
    timestamp is no concern of the order check."""
    path = write(tmp_path, "mc.jsonl",
                 '{"timestamp": 1000, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}\n\n'
                 '{"timestamp": 1000, "input_length": 600, "output_length": 0}\n'
                 '{"timestamp": 2500.5, "input_length": 7, "output_length": 2, "hash_ids": []}\n')
    trace, report = read_trace(path)
    assert trace.arrival_s.tolist() == [0.0, 0.0, 1.5005]
    assert trace.prompt_tokens.tolist() == [1100, 600, 7] and trace.output_tokens.tolist() == [5, 1, 2]
    assert report == type(report)("mc.jsonl", "mooncake", 3, 0, 1, "from the file")


@pytest.mark.parametrize("line, message", [
    ('{"timestamp": 0, "timestamp": 1, "input_length": 6, "output_length": 5}',
     "{p}:2: field 'timestamp' appears twice in one request"),
    ("[1, 2]", "{p}:2: expected a JSON object, got list"),
    ('{"timestamp": 0,', "{p}:2: malformed JSON (Expecting property name enclosed in double quotes at column 17)"),
    ('{"timestamp": -1, "input_length": 6, "output_length": 5}',
     "{p}:2: field 'timestamp' must be a number >= 0, got -1"),
    ('{"timestamp": "x", "input_length": 6, "output_length": 5}',
     "{p}:2: field 'timestamp' must be a number >= 0, got \"x\""),
    ('{"timestamp": 9, "input_length": 6.5, "output_length": 5}',
     "{p}:2: field 'input_length' must be a number >= 0 (integer tokens), got 6.5"),
    ('{"timestamp": 9, "input_length": 6, "output_length": -2}',
     "{p}:2: field 'output_length' must be a number >= 0 (integer tokens), got -2"),
    ('{"timestamp": 9, "input_length": 6, "output_length": 2, "hash_ids": [1, "x"]}',
     "{p}:2: field 'hash_ids' must be a list of integers"),
    ('{"timestamp": 9, "input_length": 6, "output_length": 2, "hash_ids": "x"}',
     "{p}:2: field 'hash_ids' must be a list of integers"),
    ('{"timestamp": 3.5, "input_length": 6, "output_length": 5}',
     "{p}:2: field 'timestamp' must be non-decreasing, got 3.5 ms after 4 ms"),
])
def test_mooncake_errors_exactly(tmp_path, line, message):
    path = write(tmp_path, "mc.jsonl", '{"timestamp": 4, "input_length": 6, "output_length": 5}\n' + line + "\n")
    with refused(path, message):
        read_trace(path, "mooncake")


def test_mooncake_without_requests(tmp_path):
    path = write(tmp_path, "mc.jsonl", "\n \n")
    with refused(path, "{p}:1: empty file, no requests"):
        read_trace(path, "mooncake")
    np.testing.assert_array_equal(load_trace(write(tmp_path, "one.jsonl", '{"timestamp": 7, "input_length": 1, '
                                                   '"output_length": 1}\n')).arrival_s, [0.0])


def test_jsonl_written_exactly_over_several_chunks(tmp_path, monkeypatch):
    """Optional fields appear only where they differ from their default, in a fixed order, and chunks of
    lines (2 here) carry on where the last one stopped; the file reads back the same, chunk by chunk."""
    monkeypatch.setattr(trace_jsonl, "_CHUNK_LINES", 2)
    t = Trace.from_arrays([0.0, 0.5, 1.0, 1.0, 2.25], [4, 600, 8, 1100, 5], [2, 3, 1, 6, 4],
                          n=[2, 1, 1, 2, 3], beam_width=[1, 2, 1, 1, 1], ids=["a", "b", "c", "d", "e"],
                          prefix_group=["g", None, "g", None, None], prefix_tokens=[4, 0, 8, 0, 0],
                          block_hashes=[[], [], [], [7, 9, 11], []], hash_block_size=512,
                          output_tokens_per_sample=[None, None, None, None, [4, 1, 2]])
    trace_jsonl.write_jsonl(t, tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").read_text().splitlines() == [
        '{"id": "a", "arrival_s": 0.0, "prompt_tokens": 4, "output_tokens": 2, "n": 2, "prefix_group": "g", '
        '"prefix_tokens": 4}',
        '{"id": "b", "arrival_s": 0.5, "prompt_tokens": 600, "output_tokens": 3, "beam_width": 2}',
        '{"id": "c", "arrival_s": 1.0, "prompt_tokens": 8, "output_tokens": 1, "prefix_group": "g", '
        '"prefix_tokens": 8}',
        '{"id": "d", "arrival_s": 1.0, "prompt_tokens": 1100, "output_tokens": 6, "n": 2, '
        '"block_hashes": [7, 9, 11]}',
        '{"id": "e", "arrival_s": 2.25, "prompt_tokens": 5, "output_tokens": 4, "n": 3, '
        '"output_tokens_per_sample": [4, 1, 2]}']
    back = trace_jsonl.read_jsonl(tmp_path / "t.jsonl")
    assert back.ids == ["a", "b", "c", "d", "e"] and back.n.tolist() == [2, 1, 1, 2, 3]
    assert back.beam_width.tolist() == [1, 2, 1, 1, 1] and back.prefix_tokens.tolist() == [4, 0, 8, 0, 0]
    assert back.block_hashes(3).tolist() == [7, 9, 11] and back.sample_lengths(4) == [4, 1, 2]
    assert back.hash_block_size == 512        # 3 hashes for 1100 tokens: Mooncake's 512-token blocks


@pytest.mark.parametrize("requests, block_size", [
    ([(1100, 3)], 512),                  # ceil(1100 / 512) hashes
    ([(1100, 2)], 512),                  # floor(1100 / 512) hashes
    ([(1024, 2)], 512),                  # exactly two blocks: long enough to tell
    ([(1100, 3), (2000, 0)], 512),       # a request without hashes says nothing
    ([(600, 2)], None),                  # no prompt of 1024 tokens or more: cannot tell
    ([(1023, 2)], None),
    ([(1100, 3), (2048, 1)], None),      # 1 hash for 2048 tokens: not 512-token blocks
    ([(1100, 4)], None),                 # more than ceil(1100 / 512)
])
def test_mooncake_block_size_is_inferred_only_when_every_count_fits(tmp_path, requests, block_size):
    lines = [f'{{"arrival_s": 0, "prompt_tokens": {p}, "output_tokens": 1'
             + (f', "block_hashes": {list(range(h))}' if h else "") + "}\n" for p, h in requests]
    path = write(tmp_path, "h.jsonl", "".join(lines))
    assert trace_jsonl.read_jsonl(path).hash_block_size == block_size


def test_vidur_order_error_format_and_microsecond_poisson(tmp_path):
    """A Vidur file's `arrived_at` going back (row 3: 2.5 s after 3 s, the file's own values) is refused;
    every Vidur report says "vidur"; Poisson arrivals are whole microseconds (6 decimals)."""
    back = write(tmp_path, "back.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1,10,2\n3,10,2\n2.5,10,2\n")
    with refused(back, "{p}:4: field 'arrived_at' must be non-decreasing, got 2.500000 s after 3.000000 s"):
        read_trace(back)
    stamped = write(tmp_path, "t.csv", "arrived_at,num_prefill_tokens,num_decode_tokens\n1,10,2\n3,10,2\n")
    lengths = write(tmp_path, "len.csv", "num_prefill_tokens,num_decode_tokens\n" + "10,2\n" * 50)
    assert [read_trace(p, rate=r)[1].format for p, r in ((stamped, None), (lengths, None), (lengths, 3.0))] \
        == ["vidur"] * 3
    poisson = read_trace(lengths, rate=3.0, seed=7)[0].arrival_s.tolist()
    assert len(set(poisson)) == 50 and all(round(s, 6) == s for s in poisson)


def test_jsonl_keeps_n_and_beam_width_together(tmp_path):
    """A request with both n = 2 and beam_width = 3 is written with both fields, n first."""
    t = Trace.from_arrays([0.0], [5], [3], n=[2], beam_width=[3])
    trace_jsonl.write_jsonl(t, tmp_path / "t.jsonl")
    assert (tmp_path / "t.jsonl").read_text() == \
        '{"arrival_s": 0.0, "prompt_tokens": 5, "output_tokens": 3, "n": 2, "beam_width": 3}\n'
    back = load_trace(tmp_path / "t.jsonl")
    assert (back.n.tolist(), back.beam_width.tolist()) == ([2], [3])
