"""The traces and cases the vLLM 0.1.4 oracle (tests/vllm/vllm2023_oracle_driver.py) is run over, and the
script that stores its records in tests/data/vllm2023_oracle/ (rerun it after changing a case):

    PYTHONPATH=$PWD python tests/vllm/vllm2023_oracle_cases.py

Traces (seeded, arrivals spread over engine steps so admissions, prompt steps and decodes interleave):
- `single`: 48 one-sequence requests (recompute preemption);
- `samples`: 36 requests, a third with 2-4 parallel samples of their own lengths (swap preemption,
  shared prompt blocks swapped once);
- `beams`: 30 requests, a third with beam width 2-4 (beams fork and die: kvsim's BeamModel, seed 0);
- `drops`: 30 requests, some prompts longer than the cases' token budget (dropped as ignored).
Pools are the same KV slots (4096, 1536, 1024, 768) at block sizes 8, 16 and 32, from roomy to tight (memory pressure); `single` and `samples` again with every victim swapped
(`"preemption": "swap"`, as the paper's Fig. 19 swap runs) in the two tightest pools; and three cases of
16-token blocks x 64 with max_num_seqs 6 or 8, or a 160-token budget.
"""

from __future__ import annotations

import gzip
import json
import random
import sys
from pathlib import Path

DATA = Path(__file__).parents[1] / "data" / "vllm2023_oracle"
TRACES = ("single", "samples", "beams", "drops")


def make_trace(kind: str, seed: int = 1) -> list[dict]:
    """Oracle trace lines (driver format) of `kind`, deterministic for `seed`."""
    rng = random.Random(f"{kind}:{seed}")
    count = {"single": 48, "samples": 36, "beams": 30, "drops": 30}[kind]
    out, step = [], 0
    for k in range(count):
        step += rng.choice((0, 0, 1, 2, 3, 5))
        r = {"id": f"r{k}", "prompt_len": rng.randint(8, 120), "output_len": rng.randint(4, 96),
             "arrival_step": step}
        if kind == "samples" and k % 3 == 1:
            r["n"] = rng.randint(2, 4)
            lens = [r["output_len"]] + [rng.randint(1, r["output_len"]) for _ in range(r["n"] - 1)]
            r["output_tokens_per_sample"] = lens
        if kind == "beams" and k % 3 == 1:
            r["beam_width"] = rng.randint(2, 4)
            r["output_len"] = rng.randint(8, 64)
        if kind == "drops" and k % 5 == 2:
            r["prompt_len"] = rng.randint(200, 300)
        out.append(r)
    return out


def cases() -> list[dict]:
    """Every (trace, pool, block size, limits) case, in driver format (trace paths relative to the repo)."""
    out = []
    for trace in TRACES:
        for b in (8, 16, 32):
            for slots in (4096, 1536, 1024, 768):
                case = {"trace": f"tests/data/vllm2023_oracle/{trace}.jsonl.gz", "block_size": b,
                        "num_blocks": slots // b, "max_num_seqs": 256, "max_num_batched_tokens": 2560,
                        "max_model_len": 2048, "cpu_blocks": 4 * slots // b}
                if trace == "drops":
                    case["max_num_batched_tokens"] = 192
                out.append(case)
    for b in (8, 16, 32):           # every victim swapped, one sequence or several (Fig. 19's swap)
        for trace in ("single", "samples"):
            for slots in (1024, 768):
                out.append({"trace": f"tests/data/vllm2023_oracle/{trace}.jsonl.gz", "block_size": b,
                            "num_blocks": slots // b, "max_num_seqs": 256, "max_num_batched_tokens": 2560,
                            "max_model_len": 2048, "cpu_blocks": 4 * slots // b, "preemption": "swap"})
    for trace, seqs, tokens in (("single", 6, 2560), ("samples", 8, 2560), ("single", 256, 160)):
        out.append({"trace": f"tests/data/vllm2023_oracle/{trace}.jsonl.gz", "block_size": 16, "num_blocks": 64,
                    "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "max_model_len": 2048,
                    "cpu_blocks": 256})
    return out


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import vllm2023_oracle_driver as driver
    DATA.mkdir(parents=True, exist_ok=True)
    for t in TRACES:
        text = "".join(json.dumps(r) + "\n" for r in make_trace(t))
        (DATA / f"{t}.jsonl.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    v = driver.load_vllm("0.1.4")
    results = []
    for case in cases():
        res = driver.run_case(v, driver.read_trace(case["trace"]), case)
        results.append({**case, **res})
        fin = res["final"]
        print(case["trace"].split("/")[-1], case["block_size"], case["num_blocks"], fin["steps"],
              fin["preemptions"], fin["swap_outs"], fin["ignored"], fin["aborted"] or "")
    text = json.dumps({"oracle": "vLLM 0.1.4 Scheduler + BlockSpaceManager (tests/vllm/vllm2023_oracle_driver.py)",
                       "cases": results}, separators=(",", ":"))
    (DATA / "records_vllm_0.1.4.json.gz").write_bytes(gzip.compress(text.encode(), mtime=0))


if __name__ == "__main__":
    main()
