"""Triton kernels and their launchers. Importing this package selects the backend first, so that
TRITON_INTERPRET=1 is set before any kernel is decorated when there is no CUDA device."""

from gpu_harness.backend import get_backend

get_backend()

from gpu_harness.kernels.contiguous_decode import contiguous_decode  # noqa: E402
from gpu_harness.kernels.copy_blocks import copy_blocks  # noqa: E402
from gpu_harness.kernels.mla_decode import mla_decode  # noqa: E402
from gpu_harness.kernels.paged_decode import paged_decode  # noqa: E402
from gpu_harness.kernels.store_kv import store_kv  # noqa: E402

__all__ = ["contiguous_decode", "copy_blocks", "mla_decode", "paged_decode", "store_kv"]
