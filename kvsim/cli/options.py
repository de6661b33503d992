"""Command-line options that several commands share, under vLLM's flag names where vLLM has one
(`--max-num-batched-tokens`, `--max-model-len`), so `kvsim run` and `kvsim capacity` spell and document
them once."""

from __future__ import annotations

from enum import Enum

import typer

TokensOpt = typer.Option(None, "--max-batched-tokens", "--max-num-batched-tokens", min=1,
                         help="Most tokens computed in one step (also sizes the activation reserve and, for "
                         "sliding-window and chunked-local layers, vLLM's blocks per request). Default: the "
                         "engine profile's; vllm-v1 as `vllm serve`: 8192 on H100/H200, 2048 on A100/L4/A10G, "
                         "16384 at >= 160 GiB; vllm-2023: 2560 (vLLM 0.1.x); ideal: 8192.")
SeqsOpt = typer.Option(None, "--max-num-seqs", min=1, help="Most sequences in one batch. Default: the engine "
                       "profile's; vllm-v1 as `vllm serve`: 1024 on H100/H200 and >= 160 GiB, 256 on "
                       "A100/L4/A10G; vllm-2023 and ideal: 256.")
MaxLenOpt = typer.Option(None, "--max-model-len", min=1, help="Longest prompt + output served, tokens "
                         "(default: the model's maximum); sizes the contiguous `max` reservation and vLLM's "
                         "maximum concurrency.")
HybridOpt = typer.Option(None, "--hybrid-kv-cache/--no-hybrid-kv-cache", help="vLLM's hybrid KV cache "
                         "manager for models with sliding-window, chunked-local or Mamba layers (default: "
                         "vLLM's choice, off for chunked local attention); --no-hybrid-kv-cache is vLLM's "
                         "--disable-hybrid-kv-cache-manager: every layer sized as full attention.")
RetentionOpt = typer.Option("0", "--prefix-cache-retention-interval", metavar="TOKENS|none", help="vLLM 0.33's "
                            "prefix-cache checkpoints of sliding-window layers: 0 (vLLM's default) keeps only "
                            "the replay boundary and shared-prefix junctions, a positive multiple of the block "
                            "size also one every TOKENS, none every block (dense).")
AsyncOpt = typer.Option(None, "--async-scheduling/--no-async-scheduling", help="vLLM's async scheduling: two "
                        "batches in flight, which sizes the sliding-window and chunked-local admission cap "
                        "(default: vLLM's, on; off: one batch).")


class Batching(str, Enum):
    """`kvsim run --batching`: continuous (iteration-level) or static (FasterTransformer-style) batching."""
    continuous = "continuous"
    static = "static"
GpuConfigOpt = typer.Option(None, "--gpu-config", help="JSON file describing a GPU without a preset: memory_gib, "
                            "hbm_gb_s, bf16_tflops (dense), optional fp8_tflops, pcie_gb_s, interconnect "
                            "(nvlink|xgmi|pcie), interconnect_gb_s (overrides --gpu; docs/gpus.md).")
