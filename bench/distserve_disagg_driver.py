"""Runs DistServe's simulator (../shared/peers/distserve, unmodified) on jobs read as JSON lines from
stdin, one JSON line of results per job on stdout. Run with `PYTHONPATH=<distserve dir>` as a separate
process: kvsim never imports DistServe (bench/distserve_disagg.py starts this).

Job: {"backend": "distserve"|"vllm", "prefill": P, "decode": D, "replicas": R (vllm), "tp": 1,
      "arrival_s": [...], "prompt": [...], "output": [...]}
Result: {"ttft_ms": [...], "tpot_ms": [...]} per request, as DistServe's
`calculate_per_request_latency` gives them (its TPOT: decoding latency / output tokens).

DistServe counts time in ms: `convert_absolutearrival_to_interarrival` takes absolute times in seconds
and returns inter-arrival gaps in ms (it multiplies by 1000), so arrivals go in as seconds here.
"""

import json
import sys

import simpy
from simdistserve.base.organize_data import (calculate_per_request_latency, organize_request_df,
                                             organize_request_event_df)
from simdistserve.base.scheduler import put_requests_with_interarrivals
from simdistserve.base.worker import WorkerConfig
from simdistserve.base.workload import convert_absolutearrival_to_interarrival, convert_pd_pair_to_request
from simdistserve.clusters.disagg import DisaggCluster
from simdistserve.clusters.vllm import VLLMCluster
from simdistserve.constants import ModelTypes
from simdistserve.estimators.memory_estimator import get_max_num_tokens


def run(job: dict) -> dict:
    model, tp = ModelTypes.opt_13b, int(job.get("tp", 1))
    max_tokens = get_max_num_tokens(model, tp, 1)
    env = simpy.Environment()
    config = WorkerConfig(model_type=model, TP=tp, TP_Prefill=tp, TP_Decode=tp,
                          prefill_max_batch_size=10 ** 7, decode_max_batch_size=10 ** 7,
                          prefill_max_tokens=max_tokens, decode_max_tokens=max_tokens,
                          enable_chunked_prefill=False, engine_type=job["backend"])
    if job["backend"] == "distserve":
        cluster = DisaggCluster(env=env, N_prefill_instance=job["prefill"], N_decode_instance=job["decode"],
                                PP_prefill=1, PP_decode=1, worker_configs=config)
    else:
        cluster = VLLMCluster(env=env, N_instance=job.get("replicas", 1), PP=1, worker_configs=config)
    cluster.run()
    requests = convert_pd_pair_to_request(list(zip(job["prompt"], job["output"])))
    arrival = convert_absolutearrival_to_interarrival(job["arrival_s"])
    put_requests_with_interarrivals(env, cluster.scheduler, arrival, requests)
    env.run()
    lat = calculate_per_request_latency(organize_request_event_df(requests),
                                        organize_request_df(requests).output_lens)
    lat = lat.sort_index()
    return {"ttft_ms": lat["first_token_latency"].tolist(), "tpot_ms": lat["tpot"].tolist()}


if __name__ == "__main__":
    for line in sys.stdin:
        if line.strip():
            print(json.dumps(run(json.loads(line))), flush=True)
