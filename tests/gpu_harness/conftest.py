"""Kernel tests run on CPU tensors under the Triton interpreter: select the backend (which sets
TRITON_INTERPRET=1 without a CUDA device) before any kernel module is imported."""

import pytest

from gpu_harness.backend import HarnessUnavailable, get_backend

try:
    BACKEND = get_backend()  # before triton is imported anywhere
except HarnessUnavailable:  # no torch/triton: skip this directory
    BACKEND = None
    collect_ignore_glob = ["test_*.py"]


@pytest.fixture
def device() -> str:
    """The torch device kernels run on ("cpu" under the interpreter)."""
    return BACKEND.device


@pytest.fixture
def gen():
    """A seeded CPU torch.Generator for inputs and block tables."""
    import torch
    return torch.Generator().manual_seed(1234)
