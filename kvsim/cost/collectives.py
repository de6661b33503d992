"""Tensor-parallel all-reduce time as vLLM V1 runs it, by message size, TP degree, link and CUDA-graph
mode (`all_reduce_s`). Seconds and bytes. Every constant is read off component measurements in
../shared/calibration/engine-evidence/collectives.csv (docs/engine-profiles.md, "vllm-v1 time model").

- NVLink / xGMI, message <= CUSTOM_AR_MAX_BYTES: vLLM's custom one-shot all-reduce, in which every GPU
  reads each peer's buffer: alpha + (tp - 1) x bytes / (link x LINK_EFFICIENCY). With alpha =
  AR_ALPHA_GRAPH_S this gives 7.0 us for H100 TP 2 at 0.5 MiB (measured 7, vllm PR #24111), 12.8 us at
  TP 6 (measured 13) and 9.9 / 14.2 / 23.0 / 40.5 us for TP 4 at 0.5 / 1 / 2 / 4 MiB (measured 10 / 14 /
  23 / 38, vllm PR #24532);
  outside a CUDA graph (eager) alpha is AR_ALPHA_EAGER_S.
- xGMI (MI300X): a full mesh, one link to each of the 7 peers (aggregate / XGMI_PEERS each), so a GPU
  reads its tp - 1 peers in parallel: alpha + bytes / (link / 7 x LINK_EFFICIENCY), at any tp.
- larger messages (prefill chunks): NCCL ring, NCCL_ALPHA_S + 2 (tp - 1) / tp x bytes / (link x eff).
- no scale-up link ("pcie" GPUs: L40S, L4, A10G, RTX): NCCL over PCIe, PCIE_ALPHA_S + 2 (tp - 1) / tp x
  bytes / PCIe rate. ASSUMED: no measurement for these GPUs exists in the evidence (thin).
"""

from __future__ import annotations

#: Fixed time of one custom all-reduce captured in a CUDA graph: the H100 TP 2 point (7 us at 0.5 MB,
#: vllm PR #24111) less its bytes term (1.5 us); TP 4 at 0.5 MB (10 us, PR #24532) less 4.4 us gives 5.6.
AR_ALPHA_GRAPH_S = 5.5e-6
#: The same launched eagerly (no graph): vLLM's custom all-reduce at <= 32 KB on H100, 8.5-9.5 us at TP 2
#: and 4 (sgl-project/sglang PR #2904, per call in a unit test).
AR_ALPHA_EAGER_S = 9.0e-6
#: Achieved fraction of the link's per-direction peak: NCCL ring bus bandwidth on NVLink4 ~365-370 of
#: 450 GB/s (NVIDIA/nccl-tests #212), P2P copy 380 of 450 (NVIDIA/nccl #1264).
LINK_EFFICIENCY = 0.8
#: vLLM's custom all-reduce buffer (vllm/distributed/device_communicators/custom_all_reduce.py,
#: max_size = 8192 * 1024): larger messages go to NCCL.
CUSTOM_AR_MAX_BYTES = 8 * 1024 * 1024
#: Peers of one GPU on an 8-GPU xGMI platform, each over its own link (MI300X: 7 x 64 GB/s per direction,
#: engine-evidence/gpus.csv "IF 7x128 = 896 GB/s"); NVLink through NVSwitch shares one per-GPU bandwidth.
XGMI_PEERS = 7
#: NCCL's fixed time per all-reduce in a graph: 16.8-19.9 us at 2-64 KB on 8 H100/H200-class GPUs
#: (sglang PR #22734), 21-23 us at 0.5 MB for TP 4-6 (vllm PRs #24532, #24111).
NCCL_ALPHA_S = 20e-6
#: NCCL all-reduce over PCIe without NVLink, fixed time: ASSUMED at the middle of the 20-60 us range the
#: evidence calls plausible (its one PCIe point: 8 x A800 PCIe across two islands, 57 us at 8 KB, vllm
#: issue #50576). No L40S / RTX measurement exists.
PCIE_ALPHA_S = 40e-6


def all_reduce_s(nbytes: float, tp: int, link: str, link_bytes_per_s: float, pcie_bytes_per_s: float,
                 graph: bool) -> float:
    """Seconds of one all-reduce of `nbytes` bytes over `tp` GPUs (0 for tp 1 or no bytes); `link`
    and its per-direction bandwidth as `GpuSpec`; `graph`: inside a CUDA graph."""
    if tp <= 1 or nbytes <= 0:
        return 0.0
    if link == "pcie":
        return PCIE_ALPHA_S + 2 * (tp - 1) / tp * nbytes / pcie_bytes_per_s
    rate = link_bytes_per_s * LINK_EFFICIENCY
    if nbytes <= CUSTOM_AR_MAX_BYTES:
        read = nbytes / (rate / XGMI_PEERS) if link == "xgmi" else (tp - 1) * nbytes / rate
        return (AR_ALPHA_GRAPH_S if graph else AR_ALPHA_EAGER_S) + read
    return NCCL_ALPHA_S + 2 * (tp - 1) / tp * nbytes / rate
