"""The requests a measured run's client sent, as a kvsim `Trace` (and the stage each request belongs to).

- inference-perf `shared_prefix` as it actually ran (real-runs/README.md, "What the generator actually
  did"): `num_groups` x `num_prompts_per_group` fixed prompts, each a group's system prompt + " " + a
  question; the prompts are shuffled once and request i sends prompt i mod P. The server sees the
  random ids re-tokenized, about 1.02-1.06 x as many tokens: the factor is the measured mean prompt
  length over (system + question), and the P prompt lengths are the measured quantile curve read at
  (k + 0.5) / P (`measured_prompt_len` of workload.json). The system part is shared within its group
  (its full blocks), the whole prompt with every re-send of it. Output: exactly `output_len` tokens.
  No seed is recorded: the shuffle uses `seed` (default 0), so the order is one of the possible ones.
- constant arrivals (evenly spaced at the stage rate: request k of a stage at start + k / rate),
  Poisson (exponential gaps) or gamma (shape = burstiness, as `vllm bench serve`); stages back to back.
- trace replay: the rows' own arrival_s, prompt_tokens and output_tokens.
"""

from __future__ import annotations

import numpy as np

from kvsim.trace.table import Trace


def arrivals(kind: str, stages: list[dict], seed: int = 0, burstiness: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    """(arrival seconds, stage index) for back-to-back stages of {rate (req/s), duration_s}; each stage
    sends round(rate x duration) requests. `kind`: constant, poisson or gamma (`burstiness` its shape)."""
    if kind not in ("constant", "poisson", "gamma"):
        raise ValueError(f"arrival type {kind!r}: known constant, poisson, gamma")
    rng = np.random.default_rng(seed)
    times, stage_of, start = [], [], 0.0
    for k, stage in enumerate(stages):
        rate, span = float(stage["rate"]), float(stage["duration_s"])
        if not (rate > 0 and span > 0):
            raise ValueError(f"stage {k}: rate and duration_s must be positive, got {rate} and {span}")
        count = int(round(rate * span))
        if kind == "constant":
            t = start + np.arange(count) / rate
        else:
            shape = 1.0 if kind == "poisson" else burstiness
            gaps = rng.gamma(shape, 1.0 / (rate * shape), size=count)
            t = start + np.concatenate([[0.0], np.cumsum(gaps[:-1])])
        times.append(t)
        stage_of.append(np.full(count, k))
        start += span
    return np.concatenate(times), np.concatenate(stage_of)


def quantile_lengths(quantiles: dict, count: int) -> np.ndarray:
    """`count` lengths read off a measured quantile curve ({"min", "p1", ..., "median", ..., "max"}) at
    (k + 0.5) / count, linear between the given points (tokens, rounded)."""
    points = []
    for key, value in quantiles.items():
        q = {"min": 0.0, "median": 50.0, "max": 100.0}.get(key)
        if q is None and key.startswith("p"):
            try:
                q = float(key[1:])
            except ValueError:
                continue
        if q is not None:
            points.append((q / 100.0, float(value)))
    if len(points) < 2:
        raise ValueError("measured_prompt_len needs at least min and max (or two quantiles)")
    points.sort()
    qs, vs = zip(*points)
    at = (np.arange(count) + 0.5) / count
    return np.rint(np.interp(at, qs, vs)).astype(np.int64)


def shared_prefix(workload: dict, block_size: int, seed: int = 0, scale: float = 1.0,
                  where: str = "workload.json") -> tuple[Trace, np.ndarray]:
    """The inference-perf shared_prefix workload (module docstring); `scale` shortens every stage
    (0.1: a tenth of each stage's duration, at the same rate). Returns (trace, stage index per request)."""
    p = workload.get("params") or {}
    for key in ("num_groups", "num_prompts_per_group", "system_prompt_len", "question_len", "output_len"):
        if key not in p:
            raise ValueError(f"{where}: field 'params.{key}' is missing")
    arrival = workload.get("arrival") or {}
    if not arrival.get("stages"):
        raise ValueError(f"{where}: field 'arrival.stages' is missing")
    groups, per_group = int(p["num_groups"]), int(p["num_prompts_per_group"])
    prompts = groups * per_group
    sys_len, question = int(p["system_prompt_len"]), int(p["question_len"])
    measured = workload.get("measured_prompt_len")
    if measured:
        curve = measured[0] if isinstance(measured, list) else measured
        lengths = quantile_lengths(curve, prompts)
        factor = float(curve.get("mean", lengths.mean())) / (sys_len + question)
    else:
        lengths, factor = np.full(prompts, sys_len + question, dtype=np.int64), 1.0
    sys_blocks = int(round(sys_len * factor)) // block_size
    rng = np.random.default_rng(seed)
    order = rng.permutation(prompts)               # prompt sent by request i: order[i % prompts]
    lengths = lengths[rng.permutation(prompts)]    # which prompt has which length: unknown, drawn
    stages = [{"rate": s["rate"], "duration_s": s["duration_s"] * scale} for s in arrival["stages"]]
    times, stage_of = arrivals(str(arrival.get("type", "constant")), stages, seed,
                               float(arrival.get("burstiness", 1.0)))
    sent = order[np.arange(len(times)) % prompts]
    prompt_hashes = []
    for q in range(prompts):
        g, full = q // per_group, int(lengths[q]) // block_size
        shared = min(sys_blocks, full)
        prompt_hashes.append([(g + 1) * 1_000_003 + k for k in range(shared)]
                             + [(q + 1) * 1_000_000_007 + k for k in range(shared, full)])
    trace = Trace.from_arrays(times, lengths[sent], np.full(len(times), int(p["output_len"])),
                              block_hashes=[prompt_hashes[q] for q in sent], hash_block_size=block_size,
                              source="inference-perf shared_prefix (regenerated)")
    return trace, stage_of


def replay_rows(rows, where: str) -> tuple[Trace, np.ndarray]:
    """A trace from per-request rows (arrival_s, prompt_tokens, output_tokens), sorted by arrival;
    one stage. Arrival times are shifted so the first is 0."""
    try:
        arr = np.array([float(r["arrival_s"]) for r in rows])
        prompt = np.array([int(r["prompt_tokens"]) for r in rows])
        output = np.array([int(r["output_tokens"]) for r in rows])
    except KeyError as exc:
        raise ValueError(f"{where}: every request needs field {exc.args[0]!r}") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where}: bad request field: {exc}") from None
    order = np.argsort(arr, kind="stable")
    arr = arr[order] - arr[order][0]
    trace = Trace.from_arrays(arr, prompt[order], np.maximum(output[order], 1), source=where)
    return trace, np.zeros(len(arr), dtype=np.int64)


def regenerate(run, block_size: int, seed: int = 0, scale: float = 1.0) -> tuple[Trace, np.ndarray]:
    """The trace a `MeasuredRun`'s client sent (`scale` < 1 shortens generated stages; replayed
    request lists are cut to their first `scale` share)."""
    if run.requests:
        trace, stage = replay_rows(run.requests, run.source)
        if scale < 1:
            keep = max(1, int(round(len(trace) * scale)))
            trace, stage = trace.head(keep), stage[:keep]
        return trace, stage
    generator = str(run.workload.get("generator", ""))
    if "shared_prefix" in generator:
        return shared_prefix(run.workload, block_size, seed, scale, f"{run.source}/workload.json")
    from kvsim.validation.bench import bench_trace
    return bench_trace(run.workload, seed, scale, run.source)
