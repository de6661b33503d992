"""The stored vLLM 0.33 scheduler records the hybrid scheduler checks compare kvsim with: running vLLM's
own scheduler over cases (tests/vllm/hybrid_scheduler_oracle_driver.py in the oracle venv), comparing
kvsim step by step, and regenerating a golden file. Shared by the synchronous, retention, Mamba and async
checks (test_hybrid_*_oracle.py)."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

from tests.vllm.test_hybrid_oracle import _oracle_python

DRIVER = Path(__file__).parent / "hybrid_scheduler_oracle_driver.py"


def vllm_records(cases: list[dict], work: Path, timeout: float | None = None, quiet: bool = True) -> str:
    """vLLM's per-step records for `cases` as the driver's JSON text (its files under `work`)."""
    path, out = work / "cases.json", work / "out.json"
    path.write_text(json.dumps(cases))
    subprocess.run([str(_oracle_python()), "-W", "ignore", str(DRIVER), str(path), str(out)], check=True,
                   capture_output=quiet, timeout=timeout)
    return out.read_text()


def regenerate(cases: list[dict], golden: Path, name: str) -> None:
    """Rewrite the gzipped golden file `golden` from a live vLLM run over `cases` (scratch files in /tmp)."""
    work = Path("/tmp") / f"hybrid_{name}"
    work.mkdir(exist_ok=True)
    text = vllm_records(cases, work, quiet=False)
    with gzip.open(golden, "wt") as f:
        f.write(text)


def assert_same_steps(case: dict, got: list[dict], want: list[dict]) -> None:
    """kvsim's records `got` equal vLLM's `want` at every step, naming the case and the first step apart."""
    first = next((j for j, (a, b) in enumerate(zip(got, want)) if a != b), None)
    assert first is None, (f"groups {case['groups']} caching {case.get('caching')} retention "
                           f"{case.get('retention')}: step {first}: kvsim {got[first]}, vLLM {want[first]}")
    assert len(got) == len(want)


def check_golden(golden_file: Path, all_cases: list[dict], run_kvsim, realistic_dense: bool) -> None:
    """kvsim (`run_kvsim(case)`) against the stored vLLM records step by step: the block-4 cases and block
    16 at retention 0 (`realistic_dense` False), or block 16 at an interval and none (True)."""
    from tests.vllm.test_hybrid_oracle import load_golden

    golden = load_golden(golden_file)
    assert len(golden) == len(all_cases)
    for case, want in zip(all_cases, golden):
        if (case["block_size"] == 16 and case["retention"] != 0) == realistic_dense:
            assert_same_steps(case, run_kvsim(case), want)
