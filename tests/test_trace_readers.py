"""Azure, Vidur and Mooncake readers and format detection at their edges: what is accepted (leading
spaces, a byte-order mark, equal timestamps, mixed timestamp precision, blank lines) and the exact
message, naming file, line and field, for everything refused."""

import re

import numpy as np
import pytest

from kvsim.trace import TraceError
from kvsim.trace_formats import detect_format, load_trace, read_trace

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
