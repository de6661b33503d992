"""Run vLLM 0.1.4's own `Scheduler` and `BlockSpaceManager` (the engine of the PagedAttention paper, August
2023) on CPU over a trace, with a fake model, and write one record per engine step.

vLLM 0.1.x's package `__init__` imports the GPU engine; the scheduler, block manager, policy, sequence and
block modules are plain Python. This driver loads them from the unmodified source (a tarball in
../shared/vllm-2023, unpacked to a cache directory) under a bare `vllm` package, with two stub modules:
`vllm.config` (the scheduler imports the config classes only as type names) and `vllm.utils` (`Device`
and `Counter`, copied; the rest needs torch and psutil). The engine's step is `LLMEngine.step` of 0.1.4
(engine/llm_engine.py) without the model: schedule, one token per scheduled sequence (`scheduler.update`,
beam forks included), stop each sequence at its own length (`_stop_sequences`' max_tokens rule; a
sample shorter than its request stops as at its end-of-sequence token), `free_finished_seq_groups`.

    python tests/vllm/vllm2023_oracle_driver.py CASES.json OUT.json [--version 0.1.4]

CASES.json: [{"trace": "trace.jsonl[.gz]", "num_blocks": N, "block_size": B, "max_num_seqs": 256,
"max_num_batched_tokens": 2560, "max_model_len": 2048, "cpu_blocks": C, "seed": 0, "beam_death_rate": 0.05,
"preemption": "auto" or "swap"}]
(all but the first three optional). Trace lines: {"id", "prompt_len", "output_len", "arrival_step",
"n", "beam_width", "output_tokens_per_sample"} (the last three optional). Beams die and fork as
kvsim's seeded `BeamModel` says (the same draws kvsim makes: the fake model's choice of beams, shared
input of both sides). OUT.json: per case its settings, `steps` (the per-step records, `RECORD_KEYS`) and
`final` (counts). A case whose swap space runs out records vLLM's abort as `final["aborted"]`.
"""

from __future__ import annotations

import enum
import gzip
import json
import logging
import os
import sys
import tarfile
import types
from pathlib import Path

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "kvsim" / "__init__.py").exists())
#: where the tarballs are: $VLLM2023_DIR, else shared/vllm-2023 beside the repo or one level up (a worktree)
TARBALLS = next((p for p in [Path(d) for d in filter(None, [os.environ.get("VLLM2023_DIR")])]
                 + [ROOT.parent / "shared" / "vllm-2023", ROOT.parent.parent / "shared" / "vllm-2023"]
                 if (p / "vllm-0.1.4.tar.gz").exists()), None)
CACHE = Path.home() / ".cache" / "kvsim-vllm2023"
#: What each step record holds (the V1 oracle's record, `oracle_common.py`, plus the 2023 engine's own).
RECORD_KEYS = ("type", "step", "prompt_run", "running", "waiting", "swapped", "admitted", "preempted",
               "recomputed", "swapped_out", "swapped_in", "finished", "ignored", "scheduled_tokens",
               "scheduled_seqs", "used_peak", "used", "free", "cpu_used_peak", "hit_tokens", "cached_free",
               "cached_hashes")


def vllm_source(version: str = "0.1.4") -> Path:
    """The unpacked source directory of vLLM `version` (unpacked from its tarball on first use)."""
    src = CACHE / f"vllm-{version}"
    if not (src / "vllm" / "core" / "scheduler.py").exists():
        if TARBALLS is None:
            raise FileNotFoundError("no vLLM 0.1.x tarballs (set VLLM2023_DIR to ../shared/vllm-2023)")
        CACHE.mkdir(parents=True, exist_ok=True)
        with tarfile.open(TARBALLS / f"vllm-{version}.tar.gz") as tar:
            tar.extractall(CACHE, filter="data")
    return src


def load_vllm(version: str = "0.1.4") -> types.SimpleNamespace:
    """vLLM's scheduler, sequence and sampling-parameter modules of `version`, imported on CPU."""
    src = vllm_source(version) / "vllm"
    for name in [m for m in sys.modules if m == "vllm" or m.startswith("vllm.")]:
        del sys.modules[name]
    pkg = types.ModuleType("vllm")
    pkg.__path__ = [str(src)]
    sys.modules["vllm"] = pkg
    config = types.ModuleType("vllm.config")
    config.CacheConfig = config.SchedulerConfig = object
    sys.modules["vllm.config"] = config
    utils = types.ModuleType("vllm.utils")

    class Device(enum.Enum):
        GPU = enum.auto()
        CPU = enum.auto()

    class Counter:
        def __init__(self, start: int = 0) -> None:
            self.counter = start

        def __next__(self) -> int:
            i = self.counter
            self.counter += 1
            return i

    utils.Device, utils.Counter = Device, Counter
    sys.modules["vllm.utils"] = utils
    import vllm.core.scheduler as scheduler
    logging.getLogger("vllm.core.scheduler").setLevel(logging.ERROR)   # (its "prompt too long" warnings)
    import vllm.sampling_params as sampling_params
    import vllm.sequence as sequence
    return types.SimpleNamespace(scheduler=scheduler, sequence=sequence, sampling_params=sampling_params)


def read_trace(path: str) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip() and not line.startswith("#")]


def run_case(v: types.SimpleNamespace, records: list[dict], case: dict) -> dict:
    """One case through vLLM's scheduler; {"steps": [...], "final": {...}}."""
    from kvsim.engine.batching.beams import BeamModel

    seq_mod, SS = v.sequence, v.sequence.SequenceStatus
    B, N = case["block_size"], case["num_blocks"]
    sched_cfg = types.SimpleNamespace(max_num_batched_tokens=case.get("max_num_batched_tokens", 2560),
                                      max_num_seqs=case.get("max_num_seqs", 256),
                                      max_model_len=case.get("max_model_len", 2048))
    cache_cfg = types.SimpleNamespace(block_size=B, num_gpu_blocks=N, num_cpu_blocks=case.get("cpu_blocks", 10 * N))
    sched = v.scheduler.Scheduler(sched_cfg, cache_cfg)
    bm = sched.block_manager
    beams = BeamModel(case.get("beam_death_rate", 0.05), case.get("seed", 0))
    events: dict[str, list] = {}

    def hook(name, fn, key):
        def wrapped(seq_group, *args, **kwargs):
            events.setdefault(key(seq_group, args), []).append(seq_group.request_id)
            return fn(seq_group, *args, **kwargs)
        setattr(sched, name, wrapped)

    if case.get("preemption") == "swap":     # every victim swapped (the paper's Fig. 19 swap runs)
        preempt, swap_mode = sched._preempt, v.scheduler.PreemptionMode.SWAP
        sched._preempt = lambda group, blocks_out, mode=None: preempt(group, blocks_out, swap_mode)
    hook("_allocate", sched._allocate, lambda g, a: "admitted")
    hook("_preempt_by_recompute", sched._preempt_by_recompute, lambda g, a: "recomputed")
    hook("_preempt_by_swap", sched._preempt_by_swap, lambda g, a: "swapped_out")
    hook("_swap_in", sched._swap_in, lambda g, a: "swapped_in")

    groups, targets, index, seq_counter, live = {}, {}, {}, 0, set()
    pending = sorted(range(len(records)), key=lambda k: (records[k].get("arrival_step", 0), k))
    pos, step, steps, ignored, preemptions = 0, 0, [], [], 0
    final = {"aborted": ""}
    while pos < len(pending) or sched.has_unfinished_seqs():
        while pos < len(pending) and records[pending[pos]].get("arrival_step", 0) <= step:
            k = pending[pos]
            r = records[k]
            rid = str(r.get("id", k))
            width = max(int(r.get("n", 1)), int(r.get("beam_width", 1)))
            lengths = sorted(r.get("output_tokens_per_sample") or [r["output_len"]] * width, reverse=True)
            seqs = []
            for j in range(width):
                seqs.append(seq_mod.Sequence(seq_counter, None, list(range(1, r["prompt_len"] + 1)), B))
                targets[seq_counter] = lengths[j]
                seq_counter += 1
            params = v.sampling_params.SamplingParams(n=width, best_of=width, max_tokens=r["output_len"],
                                                      ignore_eos=True, temperature=0.0 if r.get("beam_width", 1) > 1 else 1.0,
                                                      use_beam_search=r.get("beam_width", 1) > 1)
            groups[rid] = seq_mod.SequenceGroup(rid, seqs, params, arrival_time=float(k))
            index[rid] = k
            sched.add_seq_group(groups[rid])
            live.add(rid)
            pos += 1
        if not sched.has_unfinished_seqs():
            step = records[pending[pos]].get("arrival_step", 0)
            continue
        events.clear()
        try:
            _, out = sched.schedule()
        except RuntimeError as exc:          # "Aborted due to the lack of CPU swap space"
            final["aborted"] = str(exc)
            break
        for rid in [rid for rid in live if groups[rid].get_seqs()[0].status == SS.FINISHED_IGNORED]:
            ignored.append(rid)          # (0.1.4 drops the ignored group of a step that decodes)
            live.discard(rid)
        if out.is_empty():
            if not (sched.running or sched.swapped) and sched.waiting and not ignored:
                final["aborted"] = f"request {sched.waiting[0].request_id} never fits"
                break
            continue
        used_peak, cpu_peak = N - bm.get_num_free_gpu_blocks(), cache_cfg.num_cpu_blocks - bm.get_num_free_cpu_blocks()
        outputs = {}
        for g in out.scheduled_seq_groups:
            running = g.get_seqs(status=SS.RUNNING)
            for seq in running:
                outputs[seq.seq_id] = seq_mod.SequenceOutputs(seq.seq_id, seq.seq_id, 7, {7: 0.0})
        scheduled_seqs = len(outputs)
        sched.update(outputs)
        finished = []
        for g in out.scheduled_seq_groups:
            running = g.get_seqs(status=SS.RUNNING)
            for seq in running:
                if seq.get_output_len() >= targets[seq.seq_id]:
                    sched.free_seq(seq, SS.FINISHED_LENGTH_CAPPED)
            if g.is_finished():
                finished.append(g.request_id)
                live.discard(g.request_id)
                continue
            width, made = len(g.seqs), g.seqs[0].get_output_len()
            if g.sampling_params.use_beam_search and 2 <= made:
                # the forks kvsim's beam model makes before the next decode step (parent beam, dead beam)
                for parent, child in beams.replacements(index[g.request_id], width):
                    p, c = g.seqs[parent], g.seqs[child]
                    bm.free(c)
                    p.fork(c)
                    bm.fork(p, c)
        sched.free_finished_seq_groups()
        preempted = events.get("recomputed", []) + events.get("swapped_out", [])
        preemptions += len(preempted)
        free = bm.get_num_free_gpu_blocks()
        steps.append({
            "type": "step", "step": step, "prompt_run": out.prompt_run, "running": len(sched.running),
            "waiting": len(sched.waiting), "swapped": len(sched.swapped),
            "admitted": events.get("admitted", []), "preempted": preempted,
            "recomputed": events.get("recomputed", []), "swapped_out": events.get("swapped_out", []),
            "swapped_in": events.get("swapped_in", []), "finished": finished, "ignored": ignored,
            "scheduled_tokens": out.num_batched_tokens, "scheduled_seqs": scheduled_seqs,
            "used_peak": used_peak, "used": N - free, "free": free, "cpu_used_peak": cpu_peak,
            "hit_tokens": {}, "cached_free": 0, "cached_hashes": 0})
        ignored = []
        step += 1
    final.update({"type": "final", "oracle": f"vllm-{case.get('version', '0.1.4')}", "steps": len(steps),
                  "preemptions": preemptions, "watermark_blocks": bm.watermark_blocks,
                  "swap_outs": sum(len(s["swapped_out"]) for s in steps),
                  "recomputes": sum(len(s["recomputed"]) for s in steps),
                  "ignored": sum(len(s["ignored"]) for s in steps),
                  "prompt_steps": sum(s["prompt_run"] for s in steps)})
    return {"steps": steps, "final": final}


def main(argv: list[str]) -> None:
    cases_path, out_path = argv[0], argv[1]
    version = argv[argv.index("--version") + 1] if "--version" in argv else "0.1.4"
    sys.path.insert(0, str(ROOT))
    v = load_vllm(version)
    results = []
    for case in json.loads(Path(cases_path).read_text()):
        case = {**case, "version": version}
        results.append({**case, **run_case(v, read_trace(case["trace"]), case)})
    Path(out_path).write_text(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
