"""Run vLLM's own v1 Scheduler + KVCacheManager (the shared oracle, `vllm_oracle.run_native`) over many
(trace, pool, block size, caching) cases in one process; vLLM's import is the slow part.

Run with the oracle venv's python (never imported by kvsim or by pytest's process):
    ORACLE_DIR=../shared/oracle $ORACLE_VENV/bin/python tests/vllm/vllm_oracle_driver.py CASES.json OUT.json
CASES.json: [{"trace": "oracle-format.jsonl[.gz]", "num_blocks": N, "block_size": B, "caching": bool}].
OUT.json: per case {steps, preemptions, hit_tokens (first admissions), used (used blocks after each
step's scheduling), tokens (tokens scheduled per step)}. Token budget 8192, max_num_seqs 256.
"""

import argparse
import gzip
import json
import os
import sys
import tempfile


def main() -> None:
    cases_path, out_path = sys.argv[1], sys.argv[2]
    sys.path.insert(0, os.environ["ORACLE_DIR"])
    import oracle_common as oc
    import vllm_oracle
    cases = json.load(open(cases_path))
    results = []
    for case in cases:
        path = case["trace"]
        if path.endswith(".gz"):
            with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as tmp:
                tmp.write(gzip.open(path, "rt").read())
            trace = oc.load_trace(tmp.name)
            os.unlink(tmp.name)
        else:
            trace = oc.load_trace(path)
        bs, nb = case["block_size"], case["num_blocks"]
        trace = [t for t in trace if -(-(t.prompt_len + t.output_len - 1) // bs) <= nb]  # else vLLM waits forever
        args = argparse.Namespace(block_size=bs, num_blocks=nb, raw_num_blocks=False, max_num_seqs=256,
                                  max_num_batched_tokens=8192, no_prefix_caching=not case["caching"],
                                  hash_algo="sha256")
        steps = []
        final = vllm_oracle.run_native(trace, args, steps.append)
        results.append({**case, "steps": final["steps"], "preemptions": final["preemptions"],
                        "hit_tokens": final["prefix_hit_tokens"] if case["caching"] else 0,
                        "used": [r["used_peak"] for r in steps],
                        "tokens": [r["scheduled_tokens"] for r in steps]})
    with open(out_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
