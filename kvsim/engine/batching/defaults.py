"""The batch limits a run takes when the user gives none: `max_num_seqs` and `max_num_batched_tokens`
by the engine profile's scheduler defaults (`EngineProfile.scheduler_defaults`) and the GPU.

- "vllm-v1": what `vllm serve` picks (vllm/engine/arg_utils.py, 0.33, `get_batch_defaults` with the
  OPENAI_API_SERVER usage context, then `_set_default_max_num_seqs_and_batched_tokens_args`):

  | GPU memory (as CUDA reports it)      | max_num_batched_tokens | max_num_seqs |
  |--------------------------------------|------------------------|--------------|
  | >= 160 GiB (B200, B300)              | 16384                  | 1024         |
  | >= 70 GiB, not an A100 (H100, H200)  | 8192                   | 1024         |
  | otherwise (A100s, L4, A10G)          | 2048                   | 256          |

  then, for a defaulted token budget, at least `max_model_len` tokens when chunked prefill is off and
  at most `max_num_seqs x max_model_len`; a defaulted `max_num_seqs` at most the token budget. (vLLM
  excludes A100s from the middle tier after vllm-project/vllm#17885 measured a larger budget slowing
  them down.) `vllm run`'s offline `LLM` class doubles the budgets on H100/H200; kvsim models serving.
- "vllm-0.1.4": 256 sequences and 2560 tokens on every GPU, vLLM 0.1.x's `EngineArgs` defaults
  (vllm/engine/arg_utils.py of 0.1.2, 0.1.4 and 0.1.7: `max_num_batched_tokens: int = 2560`,
  `max_num_seqs: int = 256`), the `vllm-2023` profile's (the paper's engine, `kvsim.engine.batching.vllm2023`).
- "fixed": 256 sequences and 8192 tokens on every GPU, kvsim's defaults before per-GPU defaults (the
  `ideal` profile keeps them; vLLM 0.2 had max_num_seqs 256 and a 2560-token budget raised to the
  maximum length).
"""

from __future__ import annotations

from kvsim.specs.model import GIB

#: max_num_batched_tokens and max_num_seqs per GPU tier of `vllm serve` (table above).
VLLM_V1_LARGE = (16384, 1024)        # >= 160 GiB
VLLM_V1_HOPPER = (8192, 1024)        # >= 70 GiB, not an A100
VLLM_V1_SMALL = (2048, 256)          # the rest
FIXED = (8192, 256)
VLLM_0_1 = (2560, 256)               # vLLM 0.1.x EngineArgs (table above)
SCHEDULER_DEFAULTS = ("vllm-v1", "vllm-0.1.4", "fixed")


def tier_defaults(kind: str, gpu_name: str, gpu_memory_bytes: int) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) of scheduler defaults `kind` on a GPU, before the
    adjustments to the model's length.

    >>> tier_defaults("vllm-v1", "h100-80gb", int(79.22 * GIB))
    (8192, 1024)
    >>> tier_defaults("vllm-v1", "a100-80gb", int(79.25 * GIB))
    (2048, 256)
    """
    if kind == "fixed":
        return FIXED
    if kind == "vllm-0.1.4":
        return VLLM_0_1
    if kind != "vllm-v1":
        raise ValueError(f"unknown scheduler defaults {kind!r}; known: {', '.join(SCHEDULER_DEFAULTS)}")
    if gpu_memory_bytes >= 160 * GIB:
        return VLLM_V1_LARGE
    if gpu_memory_bytes >= 70 * GIB and "a100" not in gpu_name.lower():
        return VLLM_V1_HOPPER
    return VLLM_V1_SMALL


def batch_limits(kind: str, gpu_name: str, gpu_memory_bytes: int, max_model_len: int, chunked_prefill: bool,
                 max_num_seqs: int | None = None, max_batched_tokens: int | None = None) -> tuple[int, int]:
    """(max_num_seqs, max_batched_tokens) of a run: the given ones, the defaults for the others. Under
    "vllm-v1" a defaulted budget is raised to `max_model_len` without chunked prefill and capped at
    `max_num_seqs x max_model_len`, and defaulted sequences are capped at the budget, as vLLM does.

    >>> batch_limits("vllm-v1", "a100-40gb", int(39.5 * GIB), 4096, chunked_prefill=False)
    (256, 4096)
    >>> batch_limits("vllm-v1", "h200", int(139.8 * GIB), 2048, True, max_num_seqs=2)
    (2, 4096)
    """
    tokens, seqs = tier_defaults(kind, gpu_name, gpu_memory_bytes)
    seqs = seqs if max_num_seqs is None else max_num_seqs
    if max_batched_tokens is not None:
        tokens = max_batched_tokens
    elif kind == "vllm-v1":
        if not chunked_prefill:
            tokens = max(max_model_len, tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None and kind == "vllm-v1":
        seqs = min(seqs, tokens)
    return seqs, tokens
