"""The `kvsim` command line: run, compare, and the trace and harness sub-commands.

Every error a user can cause (a bad trace line, an unknown preset, a bad flag value) is printed as one
clear message on stderr and ends the program with exit status 2.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

# The simulator, the trace readers, rich and pandas are imported inside the commands that need them, and
# the other commands (kvsim.cli.lazy.LAZY) only when they run, so `kvsim --help` loads typer and little else.
from kvsim.engine.batching.beams import BEAM_DEATH_RATE
from kvsim.cli.commands.fleet import (BalanceAbsOpt, BalanceRelOpt, CacheThresholdOpt, CpuKvOpt, CpuKvPolicyOpt, ReplicasOpt, RouterOpt,
                             fleet_config, print_fleet, run_one, steps_files)
from kvsim.cli.lazy import RootGroup
from kvsim.cli.commands.disagg import (DecodeReplicasOpt, DecodeTpOpt, KvLinkOpt, PrefillReplicasOpt, PrefillTpOpt,
                              TpotSloOpt, TtftSloOpt)
from kvsim.cli.options import AsyncOpt, Batching, GpuConfigOpt, HybridOpt, MaxLenOpt, RetentionOpt, SeqsOpt, TokensOpt
from kvsim.cli.run_flags import check_run_flags
from kvsim.cli.vllm_args import VllmCommand
from kvsim.files import check_output_file, check_output_folder, write_json_atomic

app = typer.Typer(cls=RootGroup, help="Simulate paged and contiguous KV-cache allocation for LLM serving.",
                  no_args_is_help=True, add_completion=False, rich_markup_mode=None)


class SampleLengths(str, Enum):
    equal = "equal"
    uniform = "uniform"


class AllocatorKind(str, Enum):
    paged = "paged"
    contiguous = "contiguous"
    jenga = "jenga"


class Reserve(str, Enum):
    max = "max"
    pow2 = "pow2"
    oracle = "oracle"


class Placement(str, Enum):
    buddy = "buddy"
    first_fit = "first-fit"


class Preemption(str, Enum):
    recompute = "recompute"
    swap = "swap"


TraceArg = typer.Argument(..., help="Trace file: kvsim JSONL, Azure CSV, Mooncake JSONL or Vidur CSV.")
ModelOpt = typer.Option("opt-13b", "--model", help="Model preset or its Hugging Face id (e.g. opt-13b, "
                        "llama-3-8b, meta-llama/Meta-Llama-3-8B-Instruct).")
ModelConfigOpt = typer.Option(None, "--model-config", help="Hugging Face config.json, or a folder holding "
                              "one (overrides --model).")
GpuOpt = typer.Option("a100-40gb", "--gpu", help="GPU preset (e.g. a100-40gb, h100-80gb, h200).")
TpOpt = typer.Option(1, "--tp", "--tensor-parallel-size", "-tp", min=1, help="Tensor-parallel degree (GPUs).")
KvGibOpt = typer.Option(None, "--kv-gib", help="KV memory of the whole deployment, GiB.")
NumBlocksOpt = typer.Option(None, "--num-blocks", help="Usable KV blocks of the whole deployment. vLLM's "
                            "--num-gpu-blocks-override N (also accepted) counts its null block: N - 1 usable.")
MemUtilOpt = typer.Option(0.9, "--gpu-mem-util", "--gpu-memory-utilization", help="Fraction of GPU memory for weights + KV, when no "
                          "--kv-gib/--num-blocks.")
BlockOpt = typer.Option(16, "--block-size", min=1, help="Paged block size, tokens.")
ChunkOpt = typer.Option(None, "--chunked-prefill/--no-chunked-prefill", "--enable-chunked-prefill",
                        help="Split prompts over steps (default: the engine profile's; on for vllm-v1).")
ProfileOpt = typer.Option("vllm-v1", "--engine-profile", help="Serving engine simulated: vllm-v1 (mixed "
                          "prefill/decode, chunked prefill, V1 CPU time), vllm-2023 (the vLLM paper's engine: "
                          "prompt-only steps, v0 CPU time), ideal (kernels only), or a JSON file from "
                          "`kvsim calibrate-engine`.")
PreemptOpt = typer.Option(Preemption.recompute, "--preemption", help="How to evict when memory runs out.")
SwapOpt = typer.Option(4.0, "--swap-gib", "--swap-space", min=0.0, help="CPU swap space per GPU, GiB.")
PrefixOpt = typer.Option(None, "--prefix-caching/--no-prefix-caching", "--enable-prefix-caching",
                         help="Reuse cached prompt blocks (default: the engine profile's; on for vllm-v1 with "
                         "the paged allocators, as vLLM V1; --no-enable-prefix-caching turns it off).")
KvDtypeOpt = typer.Option("auto", "--kv-cache-dtype", help="KV cache element type: auto (the model's), "
                          "fp16, bf16 or fp8.")
CalOpt = typer.Option(None, "--calibration", help="Calibration JSON from `kvsim harness calibrate`.")
ForceCalOpt = typer.Option(False, "--force-calibration", help="Accept interpreter (CPU) timings anyway.")
FormatOpt = typer.Option("auto", "--format", help="Trace format: auto, jsonl, azure, mooncake, vidur.")
HashBlockOpt = typer.Option(None, "--hash-block-size", min=1, help="Tokens per block of the trace's "
                            "block_hashes (Mooncake: 512; default: the trace's own, else --block-size).")
JsonOpt = typer.Option(None, "--json", help="Write the summary as JSON here.")
QuietOpt = typer.Option(False, "--quiet", help="No progress bar and no table.")

MaxRequestsOpt = typer.Option(None, "--max-requests", min=1, help="Use only the trace's first N requests.")


def _build(model, model_config, gpu, tp, kv_gib, num_blocks, gpu_mem_util, block_size, max_num_seqs,
           max_batched_tokens, chunked_prefill, preemption, swap_gib, prefix_caching, calibration,
           force_calibration, seed, kv_cache_dtype="auto", max_model_len=None, engine_profile="vllm-v1",
           gpu_config=None):
    """The run's SimConfig from the command's flags and the vLLM flags it does not declare itself
    (`kvsim.cli.vllm_args`: --dtype, --quantization, --enforce-eager, ...)."""
    from kvsim.cli.vllm_args import vllm_extras
    from kvsim.cost.calibration import load_calibration
    from kvsim.engine.config import CacheConfig, SchedulerConfig, SimConfig
    from kvsim.cost.profiles import get_profile
    from kvsim.specs import Deployment, get_gpu, get_model
    from kvsim.specs.gpu import load_gpu_config
    from kvsim.specs.hf.config import load_hf_config

    spec = load_hf_config(model_config) if model_config else get_model(model)
    spec = spec.with_kv_cache_dtype(kv_cache_dtype).with_max_model_len(max_model_len)
    cal = load_calibration(calibration, force=force_calibration) if calibration else None
    cfg = SimConfig(
        deployment=Deployment(spec, load_gpu_config(gpu_config) if gpu_config else get_gpu(gpu), tp),
        cache=CacheConfig(block_size=block_size, kv_gib=kv_gib, num_blocks=num_blocks,
                          gpu_mem_util=gpu_mem_util, swap_gib=swap_gib, prefix_caching=prefix_caching),
        scheduler=SchedulerConfig(max_num_seqs, max_batched_tokens, chunked_prefill, preemption.value),
        calibration=cal, seed=seed, engine_profile=get_profile(engine_profile))
    extra, _ = vllm_extras()
    if extra:
        from kvsim.planning.runs import make_config
        cfg = make_config(cfg, **extra)
    return cfg


@app.command(cls=VllmCommand)
def run(trace: Path = TraceArg, model: str = ModelOpt, model_config: Optional[Path] = ModelConfigOpt,
        gpu: str = GpuOpt, gpu_config: Optional[Path] = GpuConfigOpt, tp: int = TpOpt,
        kv_gib: Optional[float] = KvGibOpt, num_blocks: Optional[int] = NumBlocksOpt, gpu_mem_util: float = MemUtilOpt,
        allocator: AllocatorKind = typer.Option(AllocatorKind.paged, "--allocator", help="KV allocator."),
        batching: Batching = typer.Option(Batching.continuous, "--batching", help="Batching policy."),
        reserve: Reserve = typer.Option(Reserve.max, "--reserve", help="Contiguous reservation policy."),
        placement: Placement = typer.Option(Placement.buddy, "--placement", help="Contiguous placement."),
        block_size: int = BlockOpt, max_num_seqs: Optional[int] = SeqsOpt, max_batched_tokens: Optional[int] = TokensOpt,
        chunked_prefill: Optional[bool] = ChunkOpt, preemption: Preemption = PreemptOpt, swap_gib: float = SwapOpt,
        prefix_caching: Optional[bool] = PrefixOpt, kv_cache_dtype: str = KvDtypeOpt,
        max_model_len: Optional[int] = MaxLenOpt, engine_profile: str = ProfileOpt,
        calibration: Optional[Path] = CalOpt,
        force_calibration: bool = ForceCalOpt, seed: int = typer.Option(0, "--seed", help="Random seed."),
        trace_format: str = FormatOpt, hash_block_size: Optional[int] = HashBlockOpt,
        max_requests: Optional[int] = MaxRequestsOpt, json_out: Optional[Path] = JsonOpt,
        hybrid_kv_cache: Optional[bool] = HybridOpt, retention: str = RetentionOpt, async_scheduling: Optional[bool] = AsyncOpt,
        swap_multi_seq: bool = typer.Option(False, "--swap-multi-seq", help="Preempt requests with more "
                                            "than one sequence (n > 1, beams) by swap even under "
                                            "--preemption recompute (vLLM 2023)."),
        beam_death_rate: float = typer.Option(BEAM_DEATH_RATE, "--beam-death-rate", min=0.0, max=0.999,
                                              help="Beam search: probability per decode step that a "
                                              "beam dies and is replaced by a fork of a surviving one "
                                              "(0: beams are plain samples; docs/sharing.md)."),
        sample_lengths: SampleLengths = typer.Option(SampleLengths.equal, "--sample-lengths",
                                                     help="Parallel samples: equal (each runs to the "
                                                     "request's output_tokens) or uniform (the other "
                                                     "samples stop at a length drawn from 1..output_tokens); "
                                                     "a trace's output_tokens_per_sample wins."),
        out: Optional[Path] = typer.Option(None, "--out", help="Folder for summary.json, config.json, "
                                           "requests.csv and steps.csv."),
        prefill_replicas: Optional[int] = PrefillReplicasOpt, decode_replicas: Optional[int] = DecodeReplicasOpt,
        prefill_tp: Optional[int] = PrefillTpOpt, decode_tp: Optional[int] = DecodeTpOpt,
        kv_link: str = KvLinkOpt, ttft_slo: float = TtftSloOpt, tpot_slo: float = TpotSloOpt,
        replicas: int = ReplicasOpt, router: str = RouterOpt, bal_abs: int = BalanceAbsOpt, bal_rel: float = BalanceRelOpt,
        cache_thr: float = CacheThresholdOpt, cpu_kv_gib: float = CpuKvOpt, cpu_kv_policy: str = CpuKvPolicyOpt,
        quiet: bool = QuietOpt) -> None:
    """Replay TRACE through one serving configuration and report memory, latency and throughput."""
    from kvsim.cli.output import (Progress, error, print_startup, print_summary, warn_swap_fallbacks,
                              write_outputs)
    from kvsim.planning.reports.ledger import json_summary
    from kvsim.cli.commands.trace import load_trace_checked
    from kvsim.cli.vllm_args import note_ignored, vllm_extras
    from kvsim.trace.formats import load_trace

    steps_csv = None
    try:
        fleet = fleet_config(replicas, router, bal_abs, bal_rel, cache_thr)
        steps_csv = steps_files(out, fleet)      # steps.csv, or each replica's (kvsim.cli.commands.fleet)
        if out is not None:
            check_output_folder(out, "--out")
        if json_out is not None:
            check_output_file(json_out, "--json")
        cfg = _build(model, model_config, gpu, tp, kv_gib, num_blocks, gpu_mem_util, block_size,
                     max_num_seqs, max_batched_tokens, chunked_prefill, preemption, swap_gib,
                     prefix_caching, calibration, force_calibration, seed, kv_cache_dtype, max_model_len,
                     engine_profile, gpu_config)
        cfg = replace(cfg, cache=replace(cfg.cache, allocator=allocator.value, reserve=reserve.value, cpu_kv_gib=cpu_kv_gib,
                                         cpu_kv_policy=cpu_kv_policy, placement=placement.value, hybrid_kv_cache=hybrid_kv_cache),
                      scheduler=replace(cfg.scheduler, batching=batching.value, swap_multi_seq=swap_multi_seq,
                                        beam_death_rate=beam_death_rate,
                                        sample_lengths=sample_lengths.value))
        from kvsim.planning.runs import make_config
        cfg = make_config(cfg, prefix_cache_retention_interval=retention, async_scheduling=async_scheduling)
        cfg.resolved()                                   # flags that contradict the profile fail here
        check_run_flags(cfg)                             # flags that cannot apply (kvsim.planning.flag_table)
        if prefill_replicas is not None or decode_replicas is not None:   # kvsim.cli.commands.disagg
            from kvsim.cli.commands.disagg import run_disaggregated
            return run_disaggregated(cfg, trace, lambda: load_trace(trace, trace_format), max_requests,
                                     prefill_replicas, decode_replicas, prefill_tp, decode_tp, kv_link,
                                     ttft_slo, tpot_slo, json_out, quiet, out)
        if not quiet:
            print_startup(cfg)
        note_ignored(vllm_extras()[1])
        tr = load_trace_checked(trace, trace_format, hash_block_size,
                                block_size if cfg.resolved().cache.prefix_caching and not quiet else None)
        if max_requests is not None:
            tr = tr.head(min(max_requests, len(tr)))
        with Progress(float(tr.arrival_s[-1]) if len(tr) else 0.0, enabled=not quiet) as progress:
            # steps stream to steps.csv with --out; otherwise only their aggregates are kept
            result = run_one(tr, cfg, fleet, progress, steps_csv)     # one engine, or a fleet (kvsim.cli.commands.fleet)
    except BaseException as exc:   # bad input, Ctrl-C or a bug: no half-written steps.csv is left
        if steps_csv is not None:
            steps_csv.discard()
        if not isinstance(exc, ValueError):
            raise
        error(str(exc))
    warn_swap_fallbacks(result.summary, cfg.cache.swap_gib)
    result.summary.update(json_summary({}, cfg, vllm_extras()[1]))   # the memory ledger, in both files
    if out is not None:
        write_outputs(out, result, cfg, steps_csv, fleet)
    if json_out is not None:
        write_json_atomic(json_out, result.summary, "--json")
    if not quiet:
        print_summary(result.summary, f"{trace.name}: {cfg.deployment.model.name} on "
                      f"{cfg.deployment.tp} x {cfg.deployment.gpu.name}, {allocator.value}", result.requests)
        print_fleet(result.summary)              # (a fleet's replicas and routing; nothing for one engine)


#: The configurations `kvsim compare` puts side by side (vLLM paper section 6 baselines).
COMPARED = {
    "paged": ({"allocator": "paged"}, {}),
    "contiguous-max": ({"allocator": "contiguous", "reserve": "max"}, {}),
    "contiguous-pow2": ({"allocator": "contiguous", "reserve": "pow2"}, {}),
    "contiguous-oracle": ({"allocator": "contiguous", "reserve": "oracle"}, {}),
    "static": ({"allocator": "contiguous", "reserve": "max"}, {"batching": "static"}),
}
#: Added for models with sliding, chunked or Mamba layers: every layer paged as full attention (vLLM's
#: --disable-hybrid-kv-cache-manager; not for Mamba, which vLLM refuses) and Jenga's allocator.
COMPARED_HYBRID = {
    "paged-uniform": ({"allocator": "paged", "hybrid_kv_cache": False}, {}),
    "jenga": ({"allocator": "jenga"}, {}),
}


@app.command(cls=VllmCommand)
def compare(trace: Path = TraceArg, model: str = ModelOpt, model_config: Optional[Path] = ModelConfigOpt,
            gpu: str = GpuOpt, tp: int = TpOpt, kv_gib: Optional[float] = KvGibOpt,
            num_blocks: Optional[int] = NumBlocksOpt, gpu_mem_util: float = MemUtilOpt,
            block_size: int = BlockOpt, max_num_seqs: Optional[int] = SeqsOpt, max_batched_tokens: Optional[int] = TokensOpt,
            chunked_prefill: Optional[bool] = ChunkOpt, preemption: Preemption = PreemptOpt,
            swap_gib: float = SwapOpt, prefix_caching: Optional[bool] = PrefixOpt,
            kv_cache_dtype: str = KvDtypeOpt, max_model_len: Optional[int] = MaxLenOpt,
            engine_profile: str = ProfileOpt, calibration: Optional[Path] = CalOpt, force_calibration: bool = ForceCalOpt,
            trace_format: str = FormatOpt, hash_block_size: Optional[int] = HashBlockOpt,
            max_requests: Optional[int] = MaxRequestsOpt, json_out: Optional[Path] = JsonOpt, quiet: bool = QuietOpt) -> None:
    """Run paged, the three contiguous reservations and static batching on TRACE, side by side (for
    models with sliding-window, chunked or Mamba layers also every layer paged as full attention and
    Jenga's allocator)."""
    from kvsim.cli.output import Progress, error, print_comparison, print_startup
    from kvsim.cli.commands.trace import load_trace_checked
    from kvsim.cli.vllm_args import note_ignored, vllm_extras
    from kvsim.engine.sim import simulate
    from kvsim.planning.reports.ledger import json_summary
    from kvsim.planning.studies.hybrid import max_len_tokens

    summaries, written, cfgs = {}, {}, {}
    try:
        if json_out is not None:
            check_output_file(json_out, "--json")
        base = _build(model, model_config, gpu, tp, kv_gib, num_blocks, gpu_mem_util, block_size,
                      max_num_seqs, max_batched_tokens, chunked_prefill, preemption, swap_gib,
                      prefix_caching, calibration, force_calibration, 0, kv_cache_dtype, max_model_len,
                      engine_profile)
        if not quiet:
            print_startup(base)
        note_ignored(vllm_extras()[1])
        tr = load_trace_checked(trace, trace_format, hash_block_size)
        if max_requests is not None:
            tr = tr.head(min(max_requests, len(tr)))
        systems = dict(COMPARED)
        kinds = {g.kind for g in base.deployment.model.layer_groups}
        if kinds & {"sliding", "chunked", "mamba"}:
            systems.update({k: v for k, v in COMPARED_HYBRID.items()
                            if not (k == "paged-uniform" and "mamba" in kinds) and not
                            (k == "jenga" and base.cache.num_blocks is not None)})
        for name, (cache, sched) in systems.items():
            cfg = replace(base, cache=replace(base.cache, **cache),
                          scheduler=replace(base.scheduler, **sched))
            with Progress(float(tr.arrival_s[-1]) if len(tr) else 0.0, enabled=not quiet,
                          label=name) as progress:
                summaries[name] = simulate(tr, cfg, progress, keep_steps=False).summary
            written[name], cfgs[name] = json_summary(summaries[name], cfg, vllm_extras()[1]), cfg
    except ValueError as exc:
        error(str(exc))
    if json_out is not None:
        write_json_atomic(json_out, written, "--json")   # whole, at the end
    if not quiet:
        print_comparison(summaries, f"{trace.name}: {base.deployment.model.name} on "
                         f"{base.deployment.tp} x {base.deployment.gpu.name}", max_len_tokens(cfgs))


if __name__ == "__main__":  # pragma: no cover
    app()
