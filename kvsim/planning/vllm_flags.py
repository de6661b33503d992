"""vLLM's engine flags (`vllm serve ...`) as kvsim run flags: the one table every command, sweep grid and
the Python API read, so a pasted vLLM command line gives the same run wherever it is pasted.

`VLLM_FLAGS` maps each vLLM flag name (as `vllm/engine/arg_utils.py` of vLLM 0.33 spells it, without the
leading dashes) to the kvsim run flag it sets (`kvsim.planning.runs`), or to None when it does not change
a prediction (ports, served names, tokenizer and logging options): such flags are accepted and listed as
ignored. `translate` applies the table to flat flags (Python API, `--set`, `--grid`); `split_argv`
takes the flags out of a command line (the CLI).

>>> translate({"gpu_memory_utilization": 0.8, "no_enable_prefix_caching": True, "port": 8000})
({'gpu_mem_util': 0.8, 'prefix_caching': False}, ['port'])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class VllmFlag:
    """One vLLM flag. `run_flag`: the kvsim run flag it sets (None: accepted and ignored); `takes_value`:
    whether a value follows it on the command line; `switch`: the value a bare switch sets (True for
    `--enable-x`, False for `--no-enable-x`), None for flags with a value."""

    run_flag: str | None
    takes_value: bool = True
    switch: bool | None = None
    null_block: bool = False     # the value counts vLLM's null block: the run flag gets it less one


def _value(name: str, spec: VllmFlag, value: Any) -> Any:
    """A valued flag's run-flag value: as given, or less vLLM's null block (`null_block`)."""
    if not spec.null_block:
        return value
    try:
        blocks = int(str(value).strip())
    except ValueError:
        raise ValueError(f"--{name}: {value!r} is not a whole number") from None
    if blocks < 2:
        raise ValueError(f"--{name} {blocks}: vLLM counts its null block in it, so at least 2 are needed "
                         f"(N - 1 usable); --num-blocks gives usable blocks")
    return blocks - 1


def _switch(run_flag: str | None, value: bool = True) -> VllmFlag:
    return VllmFlag(run_flag, takes_value=False, switch=value)


#: vLLM flag (no dashes) -> what it does in kvsim. Flags that change the prediction first.
VLLM_FLAGS: dict[str, VllmFlag] = {
    "tensor-parallel-size": VllmFlag("tp"), "tp": VllmFlag("tp"),
    "data-parallel-size": VllmFlag("dp"), "dp": VllmFlag("dp"),
    "enable-expert-parallel": _switch("enable_expert_parallel"),
    "gpu-memory-utilization": VllmFlag("gpu_mem_util"),
    "kv-cache-dtype": VllmFlag("kv_cache_dtype"),
    "max-num-batched-tokens": VllmFlag("max_batched_tokens"),
    "max-num-seqs": VllmFlag("max_num_seqs"),
    "max-model-len": VllmFlag("max_model_len"),
    "block-size": VllmFlag("block_size"),
    "swap-space": VllmFlag("swap_gib"),
    # vLLM's override counts the null block (block 0, never allocated: vllm/v1/core/block_pool.py), so
    # N of them leave N - 1 usable blocks: kvsim's --num-blocks N - 1
    "num-gpu-blocks-override": VllmFlag("num_blocks", null_block=True),
    "prefix-cache-retention-interval": VllmFlag("prefix_cache_retention_interval"),
    "async-scheduling": _switch("async_scheduling"),
    "no-async-scheduling": _switch("async_scheduling", False),
    "dtype": VllmFlag("dtype"),
    "quantization": VllmFlag("quantization"), "q": VllmFlag("quantization"),
    "seed": VllmFlag("seed"),
    "enable-prefix-caching": _switch("prefix_caching"),
    "no-enable-prefix-caching": _switch("prefix_caching", False),
    "enable-chunked-prefill": _switch("chunked_prefill"),
    "no-enable-chunked-prefill": _switch("chunked_prefill", False),
    "enforce-eager": _switch("enforce_eager"),
    "no-enforce-eager": _switch("enforce_eager", False),
    "disable-hybrid-kv-cache-manager": _switch("hybrid_kv_cache", False),
    # accepted, no effect on what kvsim predicts
    **{name: VllmFlag(None) for name in (
        "port", "host", "served-model-name", "api-key", "download-dir", "load-format", "tokenizer",
        "tokenizer-mode", "revision", "code-revision", "tokenizer-revision", "chat-template",
        "tool-call-parser", "uvicorn-log-level", "max-log-len", "generation-config", "root-path",
        "ssl-keyfile", "ssl-certfile", "allowed-origins", "response-role", "reasoning-parser",
        "distributed-executor-backend", "hf-config-path", "config-format", "middleware",
        # vLLM 0.33 deprecates it, with no effect: Mamba prefix caching ("align") follows
        # --enable-prefix-caching (vllm/engine/arg_utils.py `_MAMBA_CACHE_MODE_DEPRECATION_MESSAGE`)
        "mamba-cache-mode")},
    **{name: _switch(None) for name in (
        "trust-remote-code", "disable-log-requests", "enable-log-requests", "disable-log-stats",
        "enable-auto-tool-choice", "disable-frontend-multiprocessing", "disable-fastapi-docs",
        "enable-prompt-tokens-details", "disable-uvicorn-access-log")},
}


def _key(name: str) -> str:
    """`--max_num_seqs`, `max-num-seqs` -> `max-num-seqs` (the table's spelling)."""
    return name.strip().lstrip("-").replace("_", "-")


#: vLLM flag names with `_` that set a kvsim run flag under another name (`gpu_memory_utilization` ->
#: `gpu_mem_util`): the aliases `kvsim.planning.runs.normalize_flag` applies. Negating switches are left
#: out (a grid says `enable_prefix_caching=false`).
ALIASES: dict[str, str] = {name.replace("-", "_"): f.run_flag for name, f in VLLM_FLAGS.items()
                           if f.run_flag and f.switch is not False and name.replace("-", "_") != f.run_flag
                           and not f.null_block}
#: vLLM flag names (with `_`) that kvsim accepts and ignores.
IGNORED: frozenset[str] = frozenset(n.replace("-", "_") for n, f in VLLM_FLAGS.items() if f.run_flag is None)


def _truth(name: str, value: Any) -> bool:
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("1", "true", "yes", "on", ""):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name}: {value!r} is not a bool")
    return bool(value)


def translate(flags: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Flat flags with vLLM names turned into kvsim run flags, and the vLLM flags ignored (sorted).
    Names not in `VLLM_FLAGS` pass unchanged; a switch given a value (`enable_prefix_caching=False`)
    sets the run flag to it, a negating one (`no_enable_prefix_caching=True`) to its opposite, and None
    (a command's switch not given) leaves it None, the run's default."""
    out: dict[str, Any] = {}
    ignored: list[str] = []
    for name, value in flags.items():
        spec = VLLM_FLAGS.get(_key(name))
        if spec is None:
            out[name] = value
        elif spec.run_flag is None:
            ignored.append(_key(name))
        elif spec.switch is None:
            out[spec.run_flag] = _value(_key(name), spec, value)
        elif value is None:                 # (not given: the run flag keeps its default, e.g. vLLM's own)
            out[spec.run_flag] = None
        else:
            truth = _truth(name, value)
            out[spec.run_flag] = truth if spec.switch else not truth
    return out, sorted(ignored)


def split_argv(args: list[str], declared: set[str]) -> tuple[list[str], dict[str, Any], list[str]]:
    """A command line's vLLM flags that the command does not declare itself (`declared`: its option
    strings, e.g. '--tp'): (the other arguments, their run flags, the ignored vLLM flags). Values come
    as `--flag value` or `--flag=value`; ValueError when a flag that needs one has none."""
    rest: list[str] = []
    flags: dict[str, Any] = {}
    ignored: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":                       # everything after is positional
            rest += args[i:]
            break
        name, eq, inline = arg.partition("=")
        spec = VLLM_FLAGS.get(_key(name)) if arg.startswith("-") and name not in declared else None
        if spec is None:
            rest.append(arg)
            i += 1
            continue
        if spec.takes_value and not eq:
            if i + 1 >= len(args):
                raise ValueError(f"{name} needs a value")
            inline, i = args[i + 1], i + 1
        elif not spec.takes_value and eq:
            raise ValueError(f"{name} takes no value (got {arg!r})")
        i += 1
        if spec.run_flag is None:
            ignored.append(name)
        else:
            flags[spec.run_flag] = _value(_key(name), spec, inline) if spec.takes_value else spec.switch
    return rest, flags, sorted(set(ignored))
