"""`vllm bench serve --save-result` JSON: its measured means and the workload it sent.

Measured (means over completed requests, ms): `mean_e2el_ms` (only when the run asked for
`--percentile-metrics ...,e2el`), `mean_ttft_ms`, `mean_itl_ms`, `mean_tpot_ms`; `request_throughput`
(completed / duration, req/s). Missing TTFT is an error; a missing other mean is left out of the table.

Workload, in order of preference:
- `input_lens` and `output_lens` (written with `--save-detailed`): the exact lengths, in send order;
- else the random dataset from `random_input_len`, `random_output_len`, `random_range_ratio`,
  `random_prefix_len` and `seed` (pass them with `--metadata KEY=VALUE`; `dataset_name` random):
  lengths drawn as vLLM's RandomDataset draws them (numpy default_rng(seed).integers over
  [floor(len x (1 - ratio)), ceil(len x (1 + ratio))], inputs first, then outputs);
- otherwise (ShareGPT, sonnet without detail) one line naming `input_lens` is the error.
Arrivals: `request_rate` inf sends all at once; else gaps drawn from a gamma distribution of shape
`burstiness` (1: Poisson) and mean 1 / rate, with `seed`: the structure of vLLM's arrival process, not
its exact draws (vLLM draws from the global numpy state after its dataset sampling).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from kvsim.files import read_json_object
from kvsim.trace.table import Trace

_MEANS = (("e2e_ms", "mean_e2el_ms"), ("ttft_ms", "mean_ttft_ms"), ("itl_ms", "mean_itl_ms"),
          ("tpot_ms", "mean_tpot_ms"), ("throughput_rps", "request_throughput"))


def _rate(doc: dict, where: str) -> float:
    rate = doc.get("request_rate", "inf")
    try:
        rate = float(rate)
    except (TypeError, ValueError):
        raise ValueError(f"{where}: field 'request_rate' must be a number or inf, got {rate!r}") from None
    if not rate > 0:
        raise ValueError(f"{where}: field 'request_rate' must be > 0, got {rate}")
    return rate


def read_bench_result(path: Path, server: dict):
    """A `MeasuredRun` from a `vllm bench serve` result JSON and the server description."""
    from kvsim.validation.run import MeasuredRun
    doc = read_json_object(path, "vllm bench serve result")
    if "mean_ttft_ms" not in doc:
        raise ValueError(f"{path}: field 'mean_ttft_ms' is missing (not a `vllm bench serve --save-result` file?)")
    measured = {m: float(doc[k]) for m, k in _MEANS if doc.get(k) is not None}
    n = doc.get("num_prompts") or doc.get("completed")
    if doc.get("input_lens") is not None and n is not None and len(doc["input_lens"]) != int(n):
        raise ValueError(f"{path}: field 'input_lens' has {len(doc['input_lens'])} entries but num_prompts is {n}")
    workload = {"generator": "vllm bench serve", "doc": {k: v for k, v in doc.items()
                                                        if k not in ("ttfts", "itls", "generated_texts", "errors")}}
    _rate(doc, str(path))
    return MeasuredRun(name=path.stem, source=str(path), server=server, workload=workload,
                       measured={-1: measured}, client="vllm-bench-serve")


def random_lengths(n: int, input_len: int, output_len: int, ratio: float, prefix_len: int,
                   seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths as vLLM's RandomDataset draws them (module docstring)."""
    if not 0 <= ratio < 1:
        raise ValueError(f"random_range_ratio must be in [0, 1), got {ratio}")
    rng = np.random.default_rng(seed)
    lo, hi = math.floor(input_len * (1 - ratio)), math.ceil(input_len * (1 + ratio))
    inputs = rng.integers(lo, hi + 1, size=n)
    lo, hi = math.floor(output_len * (1 - ratio)), math.ceil(output_len * (1 + ratio))
    outputs = rng.integers(lo, hi + 1, size=n)
    return inputs + prefix_len, np.maximum(outputs, 1)


def bench_arrivals(n: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times (s) of `n` requests: all at 0 for an infinite rate, else gamma gaps (shape
    `burstiness`, mean 1 / rate), the first request at 0."""
    if math.isinf(rate):
        return np.zeros(n)
    if not burstiness > 0:
        raise ValueError(f"burstiness must be > 0, got {burstiness}")
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    return np.concatenate([[0.0], np.cumsum(gaps[:-1])])


def bench_trace(workload: dict, seed: int, scale: float, where: str) -> tuple[Trace, np.ndarray]:
    """The trace a `vllm bench serve` run sent (module docstring); `scale` keeps the first share."""
    doc = workload.get("doc") or {}
    seed = int(doc.get("seed", seed))
    if doc.get("input_lens") is not None and doc.get("output_lens") is not None:
        inputs = np.asarray(doc["input_lens"], dtype=np.int64)
        outputs = np.maximum(np.asarray(doc["output_lens"], dtype=np.int64), 1)
    elif str(doc.get("dataset_name", "random")) == "random" and doc.get("random_input_len") is not None:
        n = int(doc.get("num_prompts") or 0)
        if n < 1:
            raise ValueError(f"{where}: field 'num_prompts' is missing")
        inputs, outputs = random_lengths(n, int(doc["random_input_len"]), int(doc.get("random_output_len", 128)),
                                         float(doc.get("random_range_ratio", 0.0)),
                                         int(doc.get("random_prefix_len", 0)), seed)
    else:
        raise ValueError(f"{where}: field 'input_lens' is missing: save the run with --save-detailed, or give "
                         "the random dataset's random_input_len, random_output_len, random_range_ratio and "
                         "seed with --metadata")
    n = len(inputs)
    times = bench_arrivals(n, _rate(doc, where), float(doc.get("burstiness") or 1.0), seed)
    keep = n if scale >= 1 else max(1, int(round(n * scale)))
    trace = Trace.from_arrays(times[:keep], np.maximum(inputs[:keep], 1), outputs[:keep],
                              source=f"{where} (vllm bench serve, regenerated)")
    return trace, np.zeros(keep, dtype=np.int64)
