"""Topologies: the presets' devices and links, routes through switches, and malformed topologies."""

import pytest

from collectives.errors import TopologyError
from collectives.topology import (
    Device,
    Link,
    Topology,
    dgx1,
    fully_connected,
    multi_node,
    pcie_switch,
    ring,
)
from collectives.topology.presets import PRESETS


def _lanes(topology: Topology, device: str, kind: str) -> int:
    return sum(link.lanes for link in topology.links if device in (link.a, link.b) and link.kind == kind)


def test_pcie_switch_puts_every_gpu_and_the_cpu_on_one_switch_at_16_gb_s() -> None:
    t = pcie_switch(4)
    assert t.gpus == ("gpu0", "gpu1", "gpu2", "gpu3")
    assert t.neighbours("switch") == ("gpu0", "gpu1", "gpu2", "gpu3", "cpu")
    assert {link.bandwidth for link in t.links} == {16e9}
    assert t.route("gpu0", "cpu").hops == (("gpu0", "switch"), ("switch", "cpu"))


def test_dgx1_has_six_nvlinks_per_gpu_eight_of_them_doubled() -> None:
    t = dgx1()
    assert t.gpus == tuple(f"gpu{i}" for i in range(8))
    assert all(_lanes(t, gpu, "nvlink") == 6 for gpu in t.gpus)
    doubled = sorted(
        tuple(sorted((int(link.a[3:]), int(link.b[3:]))))
        for link in t.links
        if link.kind == "nvlink" and link.lanes == 2
    )
    assert doubled == [(0, 3), (0, 4), (1, 2), (1, 5), (2, 3), (4, 7), (5, 6), (6, 7)]
    link = t.link("gpu3", "gpu0")
    assert link is not None and link.bandwidth == 36e9
    assert t.link("gpu0", "gpu5") is None


def test_dgx1_routes_gpus_without_an_nvlink_through_pcie_and_qpi() -> None:
    t = dgx1()
    assert t.route("gpu0", "gpu3").hops == (("gpu0", "gpu3"),)
    route = t.route("gpu3", "gpu4")
    assert route.hops == (
        ("gpu3", "pcie1"), ("pcie1", "cpu0"), ("cpu0", "cpu1"), ("cpu1", "pcie2"), ("pcie2", "gpu4"),
    )  # fmt: skip
    assert route.latency == pytest.approx(5e-6)
    assert t.route("gpu2", "gpu2").hops == ()


def test_multi_node_routes_inside_a_node_over_nvlink_and_between_nodes_through_the_nics() -> None:
    t = multi_node(4, 8, 100)
    assert len(t.gpus) == 32
    assert t.nodes[2] == tuple(f"gpu{i}" for i in range(16, 24))
    assert t.route("gpu8", "gpu9").hops == (("gpu8", "nvswitch1"), ("nvswitch1", "gpu9"))
    hops = t.route("gpu7", "gpu8").hops
    assert hops == (
        ("gpu7", "pcie0"), ("pcie0", "nic0"), ("nic0", "network"),
        ("network", "nic1"), ("nic1", "pcie1"), ("pcie1", "gpu8"),
    )  # fmt: skip
    assert t.bandwidth(("nic0", "network")) == 12.5e9  # 100 Gbit/s
    assert t.bandwidth(("gpu8", "nvswitch1")) == 108e9  # 6 NVLinks of 18 GB/s


def test_gpus_do_not_forward_traffic() -> None:
    t = ring(4)
    assert t.route("gpu0", "gpu1").hops == (("gpu0", "gpu1"),)
    with pytest.raises(TopologyError, match="no route from gpu0 to gpu2"):
        t.route("gpu0", "gpu2")


@pytest.mark.parametrize(("n", "links"), [(1, 0), (2, 1), (3, 3), (5, 5)])
def test_ring_links_neighbours_once(n: int, links: int) -> None:
    assert len(ring(n).links) == links


def test_fully_connected_links_every_pair() -> None:
    t = fully_connected(5)
    assert len(t.links) == 10
    assert all(len(t.neighbours(gpu)) == 4 for gpu in t.gpus)


def test_every_preset_is_named_for_its_command_line() -> None:
    assert set(PRESETS) == {"pcie_switch", "dgx1", "multi_node", "ring", "fully_connected"}
    assert multi_node(2, 4, 200).name == "multi_node(2,4,200)"


@pytest.mark.parametrize(
    ("devices", "links", "message"),
    [
        ([Device("a", "gpu"), Device("a", "cpu")], [], "two devices are called 'a'"),
        ([Device("a", "tpu")], [], "kind 'tpu'"),
        ([Device("a", "gpu")], [Link("a", "b", 1e9)], "names no device 'b'"),
        ([Device("a", "gpu")], [Link("a", "a", 1e9)], "joins a to itself"),
        ([Device("a", "gpu"), Device("b", "gpu")], [Link("a", "b", 1e9), Link("b", "a", 1e9)], "bond them"),
        ([Device("a", "gpu"), Device("b", "gpu")], [Link("a", "b", 0.0)], "bandwidth 0.0"),
        ([Device("a", "gpu"), Device("b", "gpu")], [Link("a", "b", 1e9, -1.0)], "latency -1.0"),
    ],
)
def test_malformed_topologies_are_rejected(devices: list[Device], links: list[Link], message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        Topology("bad", tuple(devices), tuple(links))


def test_unknown_devices_and_links_are_named() -> None:
    t = pcie_switch(2)
    with pytest.raises(TopologyError, match="no device 'gpu7'"):
        t.route("gpu0", "gpu7")
    with pytest.raises(TopologyError, match="no link gpu0->gpu1"):
        t.bandwidth(("gpu0", "gpu1"))
    with pytest.raises(TopologyError, match="gpus must be at least 1"):
        pcie_switch(0)


def test_the_package_exports_a_sorted_all() -> None:
    import collectives.topology as package

    assert package.__all__ == sorted(package.__all__)
    assert all(hasattr(package, name) for name in package.__all__)
