"""GPUs: `GpuSpec` and the GPU presets (`get_gpu`). Bytes, bytes/s and FLOP/s."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.specs.model import GIB, find_preset


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: memory in bytes, HBM bandwidth and PCIe bandwidth in bytes/s, dense bf16 FLOP/s."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    pcie_bytes_per_s: float

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "hbm_bytes_per_s", "bf16_flops", "pcie_bytes_per_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"GpuSpec {self.name!r}: {field} must be positive")


#: GPU memory is what the device reports to CUDA (`torch.cuda.mem_get_info()`'s total, the
#: `total_gpu_memory` of vLLM's memory profiler), not the marketing figure: a little under the
#: nominal GB taken as GiB. Sources: a100-40gb 39.50 GiB and a100-80gb 79.25 GiB from PyTorch
#: out-of-memory messages ("GPU 0 has a total capacity of ..."); h100-80gb 79.22 GiB from vLLM's
#: profiler log (vllm-project/vllm#10511); h200, l4 and a10g: nvidia-smi's total (143771, 23034 and
#: 23028 MiB) less 0.6 GiB, the gap between nvidia-smi and CUDA on the A100s and the H100.
#: Bandwidths: SXM HBM, dense (non-sparse) bf16 tensor FLOP/s, and a practical host-device PCIe rate
#: (about 80 % of the link's peak).
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    GpuSpec("a100-40gb", int(39.50 * GIB), 1.555e12, 312e12, 25e9),
    GpuSpec("a100-80gb", int(79.25 * GIB), 2.039e12, 312e12, 25e9),
    GpuSpec("h100-80gb", int(79.22 * GIB), 3.35e12, 989e12, 50e9),
    GpuSpec("h200", int(139.80 * GIB), 4.8e12, 989e12, 50e9),
    GpuSpec("l4", int(21.89 * GIB), 300e9, 121e12, 25e9),
    GpuSpec("a10g", int(21.89 * GIB), 600e9, 70e12, 25e9),
)}


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset named `name` (case-insensitive); ValueError listing the known names otherwise."""
    return find_preset(GPUS, name, "GPU")
