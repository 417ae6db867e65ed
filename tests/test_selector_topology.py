"""The selector on a topology: transfers predicted on the machine's links, and what it then picks."""

import pytest

import collectives as C
from collectives.algorithms import hierarchical, multi_ring
from collectives.topology import dgx1, multi_node, pcie_switch, predict

MB160 = 160 * 10**6 // 4  # float32 elements


def test_on_a_dgx1_the_packed_rings_win() -> None:
    explanation = C.explain("allreduce", MB160, world_size=8, topology=dgx1())
    assert explanation.choice == "multi_ring"
    best = explanation.candidates[0]
    schedule = multi_ring.for_topology("allreduce", 8, MB160, dgx1())
    assert schedule is not None and best.schedule == schedule.name
    on_links = predict(schedule, dgx1(), 4)
    assert (best.latency, best.transfer) == (on_links.latency_s, on_links.bandwidth_s)
    # the two rings both ways halve the seeds' 5.19 ms bandwidth term of the one-way decomposition
    assert best.transfer == pytest.approx(0.0025926, rel=1e-3)
    assert "transfers: on the links of dgx1" in str(explanation)


def test_on_several_machines_the_hierarchical_allreduce_wins() -> None:
    machines = multi_node(4, 8, 100)
    explanation = C.explain("allreduce", MB160, world_size=32, topology=machines)
    assert explanation.choice == "hierarchical"
    schedule = hierarchical.for_topology("allreduce", 32, MB160, machines)
    assert schedule is not None and explanation.candidates[0].schedule == schedule.name
    flat = next(c for c in explanation.candidates if c.algorithm == "ring")
    assert explanation.candidates[0].time < flat.time


def test_the_shared_collectives_use_the_packed_rings_too() -> None:
    explanation = C.explain("reduce_scatter", MB160, world_size=8, topology=dgx1())
    assert explanation.choice == "multi_ring"


def test_without_a_topology_nothing_changes() -> None:
    plain = C.explain("allreduce", MB160, world_size=8)
    assert plain.topology is None
    assert "transfers: on the links" not in str(plain)
    ring = next(c for c in plain.candidates if c.algorithm == "ring")
    model = plain.model
    assert ring.transfer == pytest.approx(model.beta * 2 * 7 / 8 * MB160 * 4)


def test_the_topology_must_have_a_gpu_per_rank() -> None:
    with pytest.raises(ValueError, match=r"topology pcie_switch\(4\) has 4 GPUs, not one per rank of 8"):
        C.explain("allreduce", 10, world_size=8, topology=pcie_switch(4))
    # hooks decline machines they do not fit, and the selector builds the default schedule
    assert hierarchical.for_topology("allreduce", 8, 10, dgx1()) is None
    assert multi_ring.for_topology("broadcast", 8, 10, dgx1()) is None
