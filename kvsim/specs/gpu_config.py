"""`--gpu-config FILE`: a GPU kvsim has no preset for, described in a JSON file with datasheet units.

```json
{"name": "my-gpu", "memory_gib": 44.4, "hbm_gb_s": 864, "bf16_tflops": 362, "fp8_tflops": 733,
 "pcie_gb_s": 25, "interconnect": "pcie", "interconnect_gb_s": 0}
```
Required: `memory_gib` (what the device reports to CUDA, GiB), `hbm_gb_s` (peak memory bandwidth, GB/s),
`bf16_tflops` (DENSE bf16 tensor TFLOP/s: half the vendor's sparse headline). Optional: `name` (default
the file's stem), `fp8_tflops` (dense; 0 or absent: no fp8 tensor cores), `pcie_gb_s` (practical
host<->device rate, default 25: about 80 % of PCIe Gen4 x16), `interconnect` (nvlink, xgmi or pcie;
default pcie) and `interconnect_gb_s` (peer bandwidth of one GPU in one direction, GB/s; required unless
pcie). Unknown fields are refused (a typo would silently keep a default). Errors name the file and field.
"""

from __future__ import annotations

import math
from pathlib import Path

from kvsim.files import read_json_object
from kvsim.specs.model import GIB

#: Scale-up interconnects a GPU may have: NVLink (through NVSwitch or a bridge), AMD Infinity Fabric
#: (xGMI), or none (tensor-parallel collectives go over PCIe).
LINKS = ("nvlink", "xgmi", "pcie")

REQUIRED = ("memory_gib", "hbm_gb_s", "bf16_tflops")
OPTIONAL = ("name", "fp8_tflops", "pcie_gb_s", "interconnect", "interconnect_gb_s")
DEFAULT_PCIE_GB_S = 25.0


def _number(path: Path, doc: dict, field: str, default: float | None = None, positive: bool = True) -> float:
    value = doc.get(field, default)
    if value is None:
        raise ValueError(f"{path}: GPU config needs field {field!r} ({', '.join(REQUIRED)} are required)")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{path}: GPU config field {field!r} must be a finite number, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise ValueError(f"{path}: GPU config field {field!r} must be {'positive' if positive else '>= 0'}, "
                         f"got {value!r}")
    return float(value)


def read_gpu_config(path: str | Path) -> dict:
    """The `GpuSpec` fields (bytes, bytes/s, FLOP/s) a `--gpu-config` JSON file describes; ValueError
    naming the file and field. `kvsim.specs.gpu.load_gpu_config` builds the spec."""
    path = Path(path)
    doc = read_json_object(path, "GPU config (--gpu-config)")
    unknown = sorted(set(doc) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise ValueError(f"{path}: GPU config has unknown field {unknown[0]!r}; known: "
                         f"{', '.join(REQUIRED + OPTIONAL)}")
    name = doc.get("name", path.stem)
    if not isinstance(name, str) or not name:
        raise ValueError(f"{path}: GPU config field 'name' must be a non-empty string, got {name!r}")
    link = doc.get("interconnect", "pcie")
    if link not in LINKS:
        raise ValueError(f"{path}: GPU config field 'interconnect' must be one of {', '.join(LINKS)}, got {link!r}")
    link_gb_s = _number(path, doc, "interconnect_gb_s", 0.0, positive=False)
    if link != "pcie" and link_gb_s <= 0:
        raise ValueError(f"{path}: GPU config field 'interconnect_gb_s' must be positive for interconnect {link!r}")
    if link == "pcie" and link_gb_s:
        raise ValueError(f"{path}: GPU config field 'interconnect_gb_s' must be 0 or absent for interconnect "
                         "'pcie' (collectives then use pcie_gb_s)")
    return dict(name=name, memory_bytes=int(_number(path, doc, "memory_gib") * GIB),
                hbm_bytes_per_s=_number(path, doc, "hbm_gb_s") * 1e9,
                bf16_flops=_number(path, doc, "bf16_tflops") * 1e12,
                pcie_bytes_per_s=_number(path, doc, "pcie_gb_s", DEFAULT_PCIE_GB_S) * 1e9,
                fp8_flops=_number(path, doc, "fp8_tflops", 0.0, positive=False) * 1e12,
                link=link, link_bytes_per_s=link_gb_s * 1e9)
