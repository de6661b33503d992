"""Choose where the kernels run: a CUDA GPU, or the Triton interpreter on CPU tensors.

`get_backend()` must run before triton is first imported (the kernel package calls it itself): without
a CUDA device it sets `TRITON_INTERPRET=1`, which Triton reads when `@triton.jit` decorates a function,
its own `triton.language` helpers included.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

INSTALL_HINT = "install the GPU extra: pip install -e '.[gpu]'  (torch and triton)"


class HarnessUnavailable(RuntimeError):
    """torch or triton is missing, or the interpreter was requested too late."""


@dataclass(frozen=True, slots=True)
class Backend:
    """Where kernels run. `device` is a torch device string; `interpret` is True on the CPU interpreter."""

    device: str
    interpret: bool
    name: str  # torch.cuda.get_device_name() or "cpu-interpreter"

    @property
    def kind(self) -> str:
        """"cuda" or "interpreter" (the calibration file's `backend` field)."""
        return "interpreter" if self.interpret else "cuda"


def get_backend() -> Backend:
    """The CUDA GPU if torch sees one, else the Triton interpreter on CPU (setting TRITON_INTERPRET=1).

    Raises HarnessUnavailable with install instructions when torch or triton cannot be imported.
    """
    try:
        import torch
    except ImportError as exc:
        raise HarnessUnavailable(f"torch is not installed ({exc}); {INSTALL_HINT}") from None
    cuda = torch.cuda.is_available()
    if not cuda:
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            # triton.language's own @jit helpers (tl.cdiv, ...) were decorated for compilation.
            raise HarnessUnavailable("no CUDA device, and triton was imported before TRITON_INTERPRET=1 "
                                     "was set; call gpu_harness.backend.get_backend() before importing triton")
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        raise HarnessUnavailable(f"triton is not installed ({exc}); {INSTALL_HINT}") from None
    if cuda:
        return Backend("cuda", False, torch.cuda.get_device_name())
    return Backend("cpu", True, "cpu-interpreter")
