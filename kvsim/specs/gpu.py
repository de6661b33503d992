"""GPUs: `GpuSpec` and the GPU presets (`get_gpu`; `--gpu-config FILE` for any other GPU:
`kvsim.specs.gpu_config`). Bytes, bytes/s and FLOP/s. Datasheet figures and their sources:
../shared/calibration/engine-evidence/gpus.csv (shipped summary: docs/gpus.md)."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.specs.gpu_config import LINKS, read_gpu_config
from kvsim.specs.model import GIB, find_preset


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator: memory in bytes (as the device reports it to CUDA), HBM bandwidth and practical
    host<->device PCIe bandwidth in bytes/s, dense bf16 and fp8 tensor FLOP/s (fp8 0: no fp8 tensor
    cores; fp8 GEMMs then run at the bf16 rate), and its scale-up `link` with `link_bytes_per_s`, the
    peer bandwidth of one GPU in one direction (0 for "pcie": collectives use `pcie_bytes_per_s`)."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float
    pcie_bytes_per_s: float
    fp8_flops: float = 0.0
    link: str = "pcie"
    link_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        for field in ("memory_bytes", "hbm_bytes_per_s", "bf16_flops", "pcie_bytes_per_s"):
            if getattr(self, field) <= 0:
                raise ValueError(f"GpuSpec {self.name!r}: {field} must be positive")
        if self.fp8_flops < 0:
            raise ValueError(f"GpuSpec {self.name!r}: fp8_flops must be >= 0 (0: no fp8 tensor cores)")
        if self.link not in LINKS:
            raise ValueError(f"GpuSpec {self.name!r}: link must be one of {', '.join(LINKS)}, got {self.link!r}")
        if (self.link == "pcie") != (self.link_bytes_per_s == 0) or self.link_bytes_per_s < 0:
            raise ValueError(f"GpuSpec {self.name!r}: link_bytes_per_s must be positive for {self.link!r} "
                             "and 0 for pcie")

    def flops(self, weight_bytes_per_param: float | None) -> float:
        """Dense tensor FLOP/s of GEMMs with weights of that many bytes per parameter: fp8 (1 byte or
        less) runs at `fp8_flops` where the GPU has fp8 tensor cores, anything else at bf16's."""
        if weight_bytes_per_param is not None and weight_bytes_per_param <= 1 and self.fp8_flops:
            return self.fp8_flops
        return self.bf16_flops


def _g(name, mem_gib, hbm, bf16, pcie, fp8=0.0, link="pcie", link_bw=0.0) -> GpuSpec:
    return GpuSpec(name, int(mem_gib * GIB), hbm, bf16, pcie, fp8, link, link_bw)


#: GPU memory is what the device reports to CUDA (`torch.cuda.mem_get_info()`'s total, the
#: `total_gpu_memory` of vLLM's memory profiler), not the marketing figure: a little under the
#: nominal GB taken as GiB. Sources: a100-40gb 39.50 GiB and a100-80gb 79.25 GiB from PyTorch
#: out-of-memory messages ("GPU 0 has a total capacity of ..."); h100-80gb 79.22 GiB from vLLM's
#: profiler log (vllm-project/vllm#10511); h200, l4 and a10g: nvidia-smi's total (143771, 23034 and
#: 23028 MiB) less 0.6 GiB, the gap between nvidia-smi and CUDA on the A100s and the H100. The presets
#: added for issue 37 follow the same rule from the nvidia-smi / rocm-smi totals seen in public logs
#: (ASSUMED, not verified here): l40s 46068 MiB, rtx-4090 24564 MiB, rtx-pro-6000 97887 MiB, b200
#: 183359 MiB, mi300x 196288 MiB.
#: Rates (engine-evidence/gpus.csv, vendor datasheets): HBM/GDDR peak bandwidth; DENSE (non-sparse)
#: bf16 and fp8 tensor FLOP/s at boost clock (vendor headlines are the 2:4-sparse figures, 2x); the
#: RTX 4090's bf16 is with FP32 accumulation (half rate on GeForce: Ada whitepaper), as vLLM's GEMMs
#: accumulate; the RTX PRO 6000's dense figures are DERIVED (vendor gives only 4000 sparse FP4 TOPS,
#: halved per step); A10G compute is unpublished (70 TFLOP/s kept from before; the A10 lists 125).
#: PCIe: a practical host-device rate, about 80 % of the link's peak per direction (Gen4 x16: 25 GB/s,
#: Gen5 x16: 50 GB/s). Scale-up link per GPU per direction: NVLink3 300 GB/s (600 total), NVLink4
#: 450 (900 total), NVLink5 900 (1800 total); MI300X Infinity Fabric 7 x 64 = 448 (896 aggregate).
GPUS: dict[str, GpuSpec] = {g.name: g for g in (
    _g("a100-40gb", 39.50, 1.555e12, 312e12, 25e9, 0.0, "nvlink", 300e9),
    _g("a100-80gb", 79.25, 2.039e12, 312e12, 25e9, 0.0, "nvlink", 300e9),
    _g("h100-80gb", 79.22, 3.35e12, 989e12, 50e9, 1979e12, "nvlink", 450e9),
    _g("h200", 139.80, 4.8e12, 989e12, 50e9, 1979e12, "nvlink", 450e9),
    _g("b200", 183359 / 1024 - 0.6, 8.0e12, 2250e12, 50e9, 4500e12, "nvlink", 900e9),
    _g("mi300x", 196288 / 1024 - 0.6, 5.3e12, 1307e12, 50e9, 2615e12, "xgmi", 448e9),
    _g("l40s", 46068 / 1024 - 0.6, 864e9, 362e12, 25e9, 733e12),
    _g("l4", 21.89, 300e9, 121e12, 25e9, 242e12),
    _g("a10g", 21.89, 600e9, 70e12, 25e9),
    _g("rtx-4090", 24564 / 1024 - 0.6, 1.008e12, 165e12, 25e9, 330e12),
    _g("rtx-pro-6000", 97887 / 1024 - 0.6, 1.792e12, 500e12, 50e9, 1000e12),
)}

#: Other spellings accepted for the presets (lowercase).
GPU_ALIASES = {"h100": "h100-80gb", "h100-sxm": "h100-80gb", "h100-sxm-80gb": "h100-80gb",
               "h200-sxm": "h200", "rtx4090": "rtx-4090", "rtx-pro-6000-blackwell": "rtx-pro-6000",
               "rtxpro6000": "rtx-pro-6000"}


def get_gpu(name: str) -> GpuSpec:
    """The GPU preset named `name` (case-insensitive), or a `--gpu-config` JSON file given as a path
    ending in .json; ValueError listing the presets and naming `--gpu-config` otherwise."""
    if name.lower().endswith(".json"):
        return load_gpu_config(name)
    try:
        return find_preset(GPUS, GPU_ALIASES.get(name.lower(), name), "GPU")
    except ValueError as exc:
        raise ValueError(f"{exc}; or describe any other GPU with --gpu-config FILE.json") from None


def load_gpu_config(path) -> GpuSpec:
    """The GPU a `--gpu-config` JSON file describes (`kvsim.specs.gpu_config`); ValueError naming the
    file and field."""
    return GpuSpec(**read_gpu_config(path))
