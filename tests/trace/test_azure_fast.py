"""The pandas-free Azure CSV reader (kvsim/trace/azure_csv.py) against pandas itself.

Reference: the file read with pandas the way an analyst would (`read_csv`, `to_datetime(ISO8601)`,
`(t - t[0]).dt.total_seconds()`), independently of kvsim's readers. The plain reader must give the same
seconds bit for bit and the same lengths; files it does not take (quotes, blank lines, time zones) go to
the pandas path and read as before; and reading a plain file does not import pandas at all.
"""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from kvsim.trace.azure_csv import read_plain_azure
from kvsim.trace.formats import read_trace

ROOT = Path(__file__).resolve().parents[2]
HEADS = ROOT / "tests" / "data" / "shared_traces_head"
SHARED = Path(os.environ.get("KVSIM_SHARED", ROOT.parent / "shared")) / "traces"
FILES = [HEADS / "azure_llm_2023_code.csv", HEADS / "azure_llm_2023_conv.csv",
         SHARED / "azure_llm_2023_code.csv", SHARED / "azure_llm_2023_conv.csv"]


def pandas_reference(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    frame = pd.read_csv(path, dtype=str, skipinitialspace=True, encoding="utf-8-sig")
    t = pd.to_datetime(frame["TIMESTAMP"], format="ISO8601")
    seconds = (t - t.iloc[0]).dt.total_seconds().to_numpy()
    return seconds, frame["ContextTokens"].astype(np.int64).to_numpy(), \
        frame["GeneratedTokens"].astype(np.int64).to_numpy()


@pytest.mark.parametrize("path", FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_plain_reader_matches_pandas_bit_for_bit(path):
    if not path.exists():
        pytest.skip(f"{path} is not here")
    plain = read_plain_azure(path)
    assert plain is not None, "a shipped Azure file should take the plain path"
    for ours, ref in zip(plain, pandas_reference(path)):
        assert ours.dtype == ref.dtype and np.array_equal(ours, ref)


def write(tmp_path: Path, text: str, newline: str = "\n") -> Path:
    p = tmp_path / "t.csv"
    p.write_bytes(text.replace("\n", newline).encode("utf-8"))
    return p


ROWS = ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.995169,396,0\n2023-11-16T18:16:01,0,7\n2023-11-17 00:00:00.5,12,3\n")


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
def test_fraction_digits_separators_zero_lengths_and_crlf(tmp_path, newline):
    path = write(tmp_path, ROWS, newline)
    seconds, prompt, output = pandas_reference(path)
    assert read_plain_azure(path) is not None
    trace, report = read_trace(path)
    assert np.array_equal(trace.arrival_s, seconds)
    # by hand: 18:15:50.995169 - 18:15:46.68059 = 4.314579 s; midnight + 0.5 s is 20,653.81941 s on
    assert trace.arrival_s[1] == pytest.approx(4.314579, abs=1e-9)
    assert trace.arrival_s[3] == pytest.approx(20653.81941, abs=1e-9)
    assert list(trace.prompt_tokens) == [374, 396, 1, 12] and list(trace.output_tokens) == [44, 1, 7, 3]
    assert (report.zero_prompt_clamped, report.zero_output_clamped) == (1, 1)


@pytest.mark.parametrize("text", [
    'TIMESTAMP,ContextTokens,GeneratedTokens\n"2023-11-16 18:15:46",374,44\n',      # quoted field
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n\n2023-11-16 18:15:47,1,2\n",
    "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,374,44\n",  # a time zone
    "TIMESTAMP, ContextTokens, GeneratedTokens\n2023-11-16 18:15:46, 374, 44\n",    # spaces
    "GeneratedTokens,ContextTokens,TIMESTAMP\n44,374,2023-11-16 18:15:46\n",        # column order
])
def test_files_the_plain_reader_leaves_to_pandas_read_as_pandas_reads_them(tmp_path, text):
    path = write(tmp_path, text)
    assert read_plain_azure(path) is None
    trace, _ = read_trace(path, "azure")
    seconds, prompt, output = pandas_reference(path)
    assert np.array_equal(trace.arrival_s, seconds)
    assert list(trace.prompt_tokens) == list(prompt) and list(trace.output_tokens) == list(output)


def test_errors_still_name_the_line_and_field(tmp_path):
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,374,44\n"
                           "2023-11-16 18:15:40,1,2\n")
    with pytest.raises(ValueError, match=r"t\.csv:3: field 'TIMESTAMP' must be non-decreasing"):
        read_trace(path)
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-13-16 18:15:46,374,44\n")
    with pytest.raises(ValueError, match=r"t\.csv:2: field 'TIMESTAMP' must be a datetime"):
        read_trace(path)


def test_reading_a_plain_azure_file_does_not_import_pandas():
    code = ("import sys; from kvsim.trace.formats import load_trace; "
            f"t = load_trace({str(HEADS / 'azure_llm_2023_conv.csv')!r}); "
            "print(len(t), 'pandas' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], check=True, text=True, capture_output=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == ["200", "False"]
