"""Machines to predict on: the seeds' PCIe server, a DGX-1, several nodes on a network, rings, meshes.

Bandwidths are in GB/s (10^9 bytes per second) per direction, as the seeds
quote them: a PCIe 3.0 x16 link 16 GB/s, an NVLink of a V100 about 18 GB/s.
Latencies are per hop and only orders of magnitude; the seeds' figures leave
them out, and :func:`~collectives.topology.link_model.predict` reports them
apart from the bandwidth term.
"""

__all__ = ["PRESETS", "dgx1", "fully_connected", "multi_node", "pcie_switch", "ring"]

from collections.abc import Callable

from ..errors import TopologyError
from .graph import Device, Link, Topology

GB = 1e9
_HOP_S = 1e-6  # a PCIe or NVLink hop
_NETWORK_HOP_S = 2.5e-6  # NIC to network switch, or back

# The NVLinks of a DGX-1 with V100s (nvidia-smi topo -m): two quads, each fully
# connected, joined GPU i to GPU i + 4; 8 of the 16 pairs have two links, so
# every GPU has 6.
_DGX1_NVLINKS = {
    (0, 1): 1, (0, 2): 1, (0, 3): 2, (0, 4): 2,
    (1, 2): 2, (1, 3): 1, (1, 5): 2,
    (2, 3): 2, (2, 6): 1,
    (3, 7): 1,
    (4, 5): 1, (4, 6): 1, (4, 7): 2,
    (5, 6): 2, (5, 7): 1,
    (6, 7): 2,
}  # fmt: skip


def _gpus(count: int, node: int = 0, first: int = 0) -> list[Device]:
    return [Device(f"gpu{first + i}", "gpu", node) for i in range(count)]


def _at_least(what: str, value: int, least: int) -> None:
    if value < least:
        raise TopologyError(f"{what} must be at least {least}, got {value}")


def pcie_switch(gpus: int = 4, *, pcie_gbs: float = 16.0) -> Topology:
    """GPUs and a CPU on one non-blocking PCIe switch: the seeds' 4-GPU server.

    Every device has one link of ``pcie_gbs`` to the switch (the CPU's x16 link
    included), so any GPU can talk to any other at full speed at once, but
    everything sent to one device shares its link.
    """
    _at_least("gpus", gpus, 1)
    devices = [*_gpus(gpus), Device("cpu", "cpu"), Device("switch", "switch")]
    links = [Link(d.name, "switch", pcie_gbs * GB, _HOP_S, "pcie") for d in devices[:-1]]
    return Topology(
        f"pcie_switch({gpus})",
        tuple(devices),
        tuple(links),
        f"{gpus} GPUs and a CPU on one PCIe switch, {pcie_gbs:g} GB/s per link each way",
    )


def dgx1(*, nvlink_gbs: float = 18.0, pcie_gbs: float = 16.0, qpi_gbs: float = 19.2) -> Topology:
    """A DGX-1: 8 V100s in a hybrid cube-mesh of NVLinks, 6 per GPU, over PCIe and two CPUs.

    GPUs 0-3 and 4-7 each form a fully connected quad, and GPU i links to GPU
    i + 4; the pairs 0-3, 0-4, 1-2, 1-5, 2-3, 4-7, 5-6 and 6-7 have two NVLinks.
    Each pair of GPUs (0-1, 2-3, 4-5, 6-7) shares a PCIe switch, two switches
    hang off each CPU, and the CPUs are joined by QPI: the way between GPUs
    without an NVLink.
    """
    devices = [
        *_gpus(8),
        *(Device(f"pcie{i}", "switch") for i in range(4)),
        Device("cpu0", "cpu"),
        Device("cpu1", "cpu"),
    ]
    links = [
        Link(f"gpu{a}", f"gpu{b}", lanes * nvlink_gbs * GB, _HOP_S, "nvlink", lanes)
        for (a, b), lanes in _DGX1_NVLINKS.items()
    ]
    links += [Link(f"gpu{g}", f"pcie{g // 2}", pcie_gbs * GB, _HOP_S, "pcie") for g in range(8)]
    links += [Link(f"pcie{s}", f"cpu{s // 2}", pcie_gbs * GB, _HOP_S, "pcie") for s in range(4)]
    links.append(Link("cpu0", "cpu1", qpi_gbs * GB, _HOP_S, "qpi"))
    return Topology(
        "dgx1",
        tuple(devices),
        tuple(links),
        f"8 V100s, hybrid cube-mesh NVLink ({nvlink_gbs:g} GB/s per link each way, 6 per GPU), "
        f"PCIe {pcie_gbs:g} GB/s, QPI {qpi_gbs:g} GB/s",
    )


def multi_node(
    nodes: int,
    gpus_per_node: int,
    nic_gbps: float = 100.0,
    *,
    nvlink_gbs: float = 18.0,
    nvlinks_per_gpu: int = 6,
    pcie_gbs: float = 16.0,
) -> Topology:
    """Machines of ``gpus_per_node`` GPUs, each with one NIC of ``nic_gbps`` gigabits per second.

    Inside a machine the GPUs meet at an NVSwitch (``nvlinks_per_gpu`` NVLinks
    each), and share a PCIe switch with the CPU and the NIC; the NICs meet at
    one network switch. GPU ``k * gpus_per_node + j`` is GPU ``j`` of machine
    ``k``. 100 Gbit/s is 12.5 GB/s, below one GPU's PCIe link: the NIC is the
    narrow part.
    """
    _at_least("nodes", nodes, 1)
    _at_least("gpus_per_node", gpus_per_node, 1)
    gpu_gbs = nvlinks_per_gpu * nvlink_gbs
    devices: list[Device] = []
    links: list[Link] = []
    for k in range(nodes):
        gpus = _gpus(gpus_per_node, k, k * gpus_per_node)
        nvswitch, pcie, cpu, nic = f"nvswitch{k}", f"pcie{k}", f"cpu{k}", f"nic{k}"
        devices += [*gpus, Device(nvswitch, "switch", k), Device(pcie, "switch", k)]
        devices += [Device(cpu, "cpu", k), Device(nic, "nic", k)]
        for gpu in gpus:
            links.append(Link(gpu.name, nvswitch, gpu_gbs * GB, _HOP_S, "nvlink", nvlinks_per_gpu))
            links.append(Link(gpu.name, pcie, pcie_gbs * GB, _HOP_S, "pcie"))
        links.append(Link(cpu, pcie, pcie_gbs * GB, _HOP_S, "pcie"))
        links.append(Link(nic, pcie, pcie_gbs * GB, _HOP_S, "pcie"))
        links.append(Link(nic, "network", nic_gbps / 8 * GB, _NETWORK_HOP_S, "network"))
    devices.append(Device("network", "switch", None))
    return Topology(
        f"multi_node({nodes},{gpus_per_node},{nic_gbps:g})",
        tuple(devices),
        tuple(links),
        f"{nodes} nodes of {gpus_per_node} GPUs (NVSwitch, {gpu_gbs:g} GB/s per GPU each way), "
        f"one {nic_gbps:g} Gbit/s NIC per node",
    )


def ring(n: int, *, link_gbs: float = 18.0) -> Topology:
    """``n`` GPUs in a ring, GPU i linked directly to GPU i + 1."""
    _at_least("n", n, 1)
    pairs = sorted({tuple(sorted((i, (i + 1) % n))) for i in range(n) if n > 1})
    links = tuple(Link(f"gpu{a}", f"gpu{b}", link_gbs * GB, _HOP_S, "nvlink") for a, b in pairs)
    return Topology(f"ring({n})", tuple(_gpus(n)), links, f"{n} GPUs in a ring of {link_gbs:g} GB/s links")


def fully_connected(n: int, *, link_gbs: float = 18.0) -> Topology:
    """``n`` GPUs, every pair joined by its own link."""
    _at_least("n", n, 1)
    links = tuple(
        Link(f"gpu{a}", f"gpu{b}", link_gbs * GB, _HOP_S, "nvlink") for a in range(n) for b in range(a + 1, n)
    )
    return Topology(
        f"fully_connected({n})", tuple(_gpus(n)), links, f"{n} GPUs, every pair linked at {link_gbs:g} GB/s"
    )


PRESETS: dict[str, Callable[..., Topology]] = {
    "pcie_switch": pcie_switch,
    "dgx1": dgx1,
    "multi_node": multi_node,
    "ring": ring,
    "fully_connected": fully_connected,
}
"""The presets by name, for command lines."""
