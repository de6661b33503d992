"""vLLM 0.33's own Triton decode kernels, loaded from the oracle venv's source to run on this venv's
Triton (the oracle venv has no triton): the MLA decode (`v1/attention/ops/triton_decode_attention.py`,
`decode_attention_fwd(..., is_mla=True)`, as TritonMLAImpl.forward_mqa calls it) and the unified
attention kernel with a sliding window (`v1/attention/ops/triton_unified_attention.py`, as the Triton
backend calls it with window_size=(W-1, 0)) or a local-attention chunk (chunk_lookback=0).

The few vllm imports those files make (platform, envs, logger, the KV quantisation enum) are answered by
stand-ins for a CUDA-less, non-ROCm, non-fp8 platform; they are in sys.modules only while the files
load. Nothing of vLLM is copied into kvsim: the source is read from the oracle venv at test time.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import sys
import types
from pathlib import Path

ORACLE_VENV = Path(os.environ.get("ORACLE_VENV", Path.home() / ".cache" / "vllm-oracle-venv"))
OPS = ORACLE_VENV / "lib" / "python3.11" / "site-packages" / "vllm" / "v1" / "attention" / "ops"
FILES = ("triton_decode_attention.py", "triton_attention_helpers.py", "triton_unified_attention.py")


def available() -> str | None:
    """None when vLLM's kernel sources are there, else why not (a skip reason)."""
    missing = [f for f in FILES if not (OPS / f).is_file()]
    return f"vLLM oracle venv kernels not found under {OPS} ({', '.join(missing)})" if missing else None


class _KVQuantMode(enum.IntEnum):  # the members the kernels' launchers name (vllm/v1/kv_cache_interface.py)
    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4


def _stubs():
    import torch
    import triton
    import triton.language as tl

    class Platform:
        @staticmethod
        def is_rocm():
            return False

        @staticmethod
        def fp8_dtype():
            return torch.float8_e4m3fn

        @staticmethod
        def is_device_capability_family(_family):
            return False

    class Logger:
        def __getattr__(self, _name):
            return lambda *a, **k: None

    mods = {name: types.ModuleType(name) for name in (
        "vllm", "vllm.envs", "vllm.logger", "vllm.platforms", "vllm.triton_utils", "vllm.v1",
        "vllm.v1.kv_cache_interface", "vllm.v1.attention", "vllm.v1.attention.ops")}
    mods["vllm.envs"].VLLM_BATCH_INVARIANT = False
    mods["vllm.logger"].init_logger = lambda _name: Logger()
    mods["vllm.platforms"].current_platform = Platform()
    mods["vllm.triton_utils"].triton = triton
    mods["vllm.triton_utils"].tl = tl
    mods["vllm.v1.kv_cache_interface"].KVQuantMode = _KVQuantMode
    mods["vllm"].envs = mods["vllm.envs"]
    return mods


def load() -> types.SimpleNamespace:
    """(decode_attention_fwd, unified_attention) from vLLM's source; the Triton backend must already be
    chosen (gpu_harness.backend.get_backend, which sets TRITON_INTERPRET=1 without a GPU)."""
    reason = available()
    if reason:
        raise FileNotFoundError(reason)
    saved = {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.")}
    sys.modules.update(_stubs())
    try:
        loaded = {}
        for f in FILES:
            name = "vllm.v1.attention.ops." + f[:-3]
            spec = importlib.util.spec_from_file_location(name, OPS / f)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # the unified kernel imports the helpers by this name
            spec.loader.exec_module(module)
            loaded[f[:-3]] = module
    finally:
        for k in [k for k in sys.modules if k == "vllm" or k.startswith("vllm.")]:
            del sys.modules[k]
        sys.modules.update(saved)
    return types.SimpleNamespace(decode_attention_fwd=loaded["triton_decode_attention"].decode_attention_fwd,
                                 unified_attention=loaded["triton_unified_attention"].unified_attention)
