"""The link a request's KV cache crosses from a prefill instance to a decode instance: bandwidth
and a per-transfer latency. Transfer time = latency + bytes / bandwidth, with bytes = prompt tokens x
the model's KV bytes per token (all layers, K and V, the whole TP group: `Deployment.kv_bytes_per_token`).

The whole request moves over one link of the named kind at its one-way bandwidth (no overlap with the
prefill, no contention between transfers: each starts when its prefill ends; DistServe's simulator moves
KV in no time at all). Sources, per direction:

- `nvlink`: NVLink 4 on H100 SXM, 900 GB/s per GPU in both directions together (NVIDIA H100 Tensor Core
  GPU datasheet, "NVLink: 900GB/s"), so 450 GB/s one way. Latency 4.1 us: the best-pair GPU-to-GPU P2P
  read measured by p2pmark (github.com/lukealonso/p2pmark, README) over PCIe 5; no NVLink-specific
  figure was found, so this is an upper bound for NVLink.
- `ib-400`: InfiniBand NDR, 400 Gb/s per port = 50 GB/s (NVIDIA ConnectX-7 / Quantum-2 NDR datasheets).
  Latency 4.6 us: `ib_send_lat` one-way, reliable connection, 32 KB messages (D. Potter, master's thesis,
  tables/mtu_performance.tex, git.dennispotter.eu), a block-sized KV message.
- `roce-100`: RoCE v2 over 100 Gb/s Ethernet = 12.5 GB/s (IEEE 802.3 100GBASE). Latency: the same RDMA
  one-way figure as `ib-400` (4.6 us); no separate RoCE measurement is used.
- `pcie`: PCIe 4.0 x16, 16 GT/s x 16 lanes x 128/130 = 31.5 GB/s one way (PCI-SIG PCIe 4.0 spec);
  `pcie5`: PCIe 5.0 x16, 63 GB/s (PCI-SIG PCIe 5.0; p2pmark measured 54-56 GB/s P2P writes on Gen5 x16).
  Latency 4.1 us (p2pmark, above).

Seconds and bytes throughout.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class KVLink:
    """One link kind: one-way `bandwidth_Bps` (bytes/s) and `latency_s` per transfer (s)."""

    name: str
    bandwidth_Bps: float
    latency_s: float
    source: str

    def __post_init__(self) -> None:
        if not self.bandwidth_Bps > 0:
            raise ValueError(f"--kv-link {self.name}: bandwidth must be > 0 bytes/s, got {self.bandwidth_Bps}")
        if not self.latency_s >= 0:
            raise ValueError(f"--kv-link {self.name}: latency must be >= 0 s, got {self.latency_s}")

    def transfer_seconds(self, tokens: int, kv_bytes_per_token: int) -> float:
        """Seconds to move `tokens` tokens' KV of `kv_bytes_per_token` bytes each: latency + bytes / bandwidth."""
        return self.latency_s + tokens * kv_bytes_per_token / self.bandwidth_Bps


_P2P_LATENCY_S = 4.1e-6       # p2pmark best-pair P2P read (see the module docstring)
_RDMA_LATENCY_S = 4.6e-6      # ib_send_lat one-way, RC, 32 KB (see the module docstring)

LINKS: dict[str, KVLink] = {link.name: link for link in (
    KVLink("nvlink", 450e9, _P2P_LATENCY_S, "NVLink 4, H100 datasheet 900 GB/s both ways"),
    KVLink("ib-400", 400e9 / 8, _RDMA_LATENCY_S, "InfiniBand NDR 400 Gb/s"),
    KVLink("roce-100", 100e9 / 8, _RDMA_LATENCY_S, "RoCE v2, 100 Gb/s Ethernet"),
    KVLink("pcie", 16e9 * 16 * 128 / 130 / 8, _P2P_LATENCY_S, "PCIe 4.0 x16"),
    KVLink("pcie5", 32e9 * 16 * 128 / 130 / 8, _P2P_LATENCY_S, "PCIe 5.0 x16"),
)}


def get_link(name: str) -> KVLink:
    """The link called `name`; ValueError naming `--kv-link` and the known names otherwise."""
    try:
        return LINKS[name]
    except KeyError:
        raise ValueError(f"unknown --kv-link {name!r}; known: {', '.join(LINKS)}") from None
