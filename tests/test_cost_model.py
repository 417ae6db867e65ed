"""The cost model: links pinned to the seeds' 160 MB figures, the DGX-1 and nodes; alpha-beta-gamma.

The seeds count bandwidth alone, so their figures are the ``bandwidth_s`` part
of a prediction; ``latency_s`` adds each step's longest route (1 us a PCIe or
NVLink hop, 2.5 us a network hop in the presets). The closed alpha-beta-gamma
model is checked on hand-built schedules and against the textbook formulas.
"""

import math

import pytest

from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical, multi_ring, ring
from collectives.errors import TopologyError
from collectives.schedule import Schedule, Step, Transfer
from collectives.simulate import simulate
from collectives.specs import COLLECTIVES
from collectives.topology import dgx1, fully_connected, multi_node, pack_rings, pcie_switch
from collectives.topology import ring as ring_topology
from collectives.topology.cost_model import DEFAULT_MODEL, CostModel, Traffic, traffic
from collectives.topology.link_model import predict
from collectives.topology.strategies import aggregate_on, split_aggregation

SIZE = 160 * 10**6  # the seeds' 160 MB of gradients
FLOAT32 = 4
COUNT = SIZE // FLOAT32
HOP = 1e-6
# whole numbers of "seconds" keep the hand computations exact
UNIT = CostModel(alpha=2.0, beta=3.0, gamma=5.0)


def test_seeds_aggregating_on_one_gpu_takes_60_ms() -> None:
    # 3 x 160 MB into GPU 0's one 16 GB/s link (30 ms), and 3 x 160 MB out of it (30 ms)
    t = pcie_switch(4)
    strategy = aggregate_on(t, "gpu0", COUNT)
    p = predict(strategy.schedule, t, FLOAT32, strategy.placement)
    assert p.bandwidth_s == pytest.approx(0.060, rel=1e-12)
    assert p.latency_s == pytest.approx(2 * 2 * HOP)  # two steps, two hops through the switch
    assert p.time_s == pytest.approx(0.060004)
    assert [s.bandwidth_s for s in p.per_step] == pytest.approx([0.030, 0.030])
    assert p.busiest_link == ("switch", "gpu0")
    assert p.link_bytes[("switch", "gpu0")] == p.link_bytes[("gpu0", "switch")] == 3 * SIZE


def test_seeds_aggregating_on_the_cpu_takes_80_ms() -> None:
    # the CPU joins as a fifth rank: 4 x 160 MB through its link each way
    t = pcie_switch(4)
    strategy = aggregate_on(t, "cpu", COUNT)
    assert strategy.placement == ("gpu0", "gpu1", "gpu2", "gpu3", "cpu")
    assert strategy.schedule.name == "allreduce-star(n=5,root=4)"
    p = predict(strategy.schedule, t, FLOAT32, strategy.placement)
    assert p.bandwidth_s == pytest.approx(0.080, rel=1e-12)
    assert p.busiest_link == ("switch", "cpu")
    assert p.busiest_link_s == pytest.approx(0.040)


def test_seeds_split_aggregation_over_the_four_gpus_takes_15_ms() -> None:
    # each GPU aggregates 40 MB: 3 x 40 MB over every link each way, twice (7.5 ms each)
    t = pcie_switch(4)
    strategy = split_aggregation(t, COUNT)
    p = predict(strategy.schedule, t, FLOAT32, strategy.placement)
    assert p.bandwidth_s == pytest.approx(0.015, rel=1e-12)
    assert [s.bandwidth_s for s in p.per_step] == pytest.approx([0.0075, 0.0075])
    assert set(p.link_bytes.values()) == {2 * 3 * SIZE // 4}


def test_the_ring_on_the_pcie_server_matches_split_aggregation() -> None:
    # 2 (P - 1) / P * 160 MB / 16 GB/s: the same bytes per link, in 6 steps instead of 2
    p = predict(ring.allreduce(4, COUNT), pcie_switch(4), FLOAT32)
    assert p.bandwidth_s == pytest.approx(0.015, rel=1e-12)
    assert p.latency_s == pytest.approx(6 * 2 * HOP)


def _two_rings(bidirectional: bool) -> Schedule:
    packing = pack_rings(dgx1())
    return multi_ring.allreduce(
        8, COUNT, packing.rank_rings(), packing.bandwidths, bidirectional=bidirectional
    )


def test_dgx1_two_ring_decomposition_takes_about_the_seeds_6_ms() -> None:
    # The seeds' 2 * 160 MB / (3 * 18 GB/s) = 5.93 ms rounds the ring's 2 (P - 1) / P up to 2:
    # the exact ring moves 2 * 7/8 of the buffer, 5.19 ms, each link of both rings busy every step.
    p = predict(_two_rings(False), dgx1(), FLOAT32)
    seeds = 2 * SIZE / (3 * 18e9)
    assert seeds == pytest.approx(5.926e-3, rel=1e-4)
    assert p.bandwidth_s == pytest.approx(2 * 7 / 8 * SIZE / 54e9, rel=1e-6)
    assert p.bandwidth_s / seeds == pytest.approx(7 / 8, rel=1e-6)
    assert p.latency_s == pytest.approx(14 * HOP)  # 2 (P - 1) steps over direct NVLinks
    assert all(len(t.hops) == 1 for t in (dgx1().route(*h) for h in p.link_bytes))


def test_dgx1_bidirectional_two_rings_halve_the_bandwidth_term() -> None:
    # the reversed rings use the other direction of every NVLink, so each direction carries half
    t = dgx1()
    one_way = predict(_two_rings(False), t, FLOAT32)
    both = predict(_two_rings(True), t, FLOAT32)
    assert both.bandwidth_s == pytest.approx(one_way.bandwidth_s / 2, rel=1e-6)
    assert both.latency_s == pytest.approx(one_way.latency_s)  # the same 14 steps
    assert one_way.time_s - both.time_s == pytest.approx(one_way.bandwidth_s / 2, rel=1e-6)
    assert both.bandwidth_s == pytest.approx(7 / 8 * SIZE / 54e9, rel=1e-6)  # 2.59 ms
    used = set(both.link_bytes)
    assert all((b, a) in used for a, b in used)


def test_multi_node_hierarchical_beats_the_flat_ring_over_32_gpus() -> None:
    t = multi_node(4, 8, 100)
    flat = predict(ring.allreduce(32, COUNT), t, FLOAT32)
    nodes = predict(hierarchical.allreduce(32, COUNT, local_size=8), t, FLOAT32)
    # flat: 62 steps of 160/32 MB through each 12.5 GB/s NIC, every step a 9 us route across nodes
    assert flat.bandwidth_s == pytest.approx(62 * 5e6 / 12.5e9, rel=1e-9)  # 24.8 ms
    assert flat.latency_s == pytest.approx(62 * 9e-6)
    # hierarchical: 2 x 7 node steps of 20 MB over 108 GB/s NVSwitch links, then 6 rail steps
    # of 8 rails x 5 MB through each NIC
    assert nodes.bandwidth_s == pytest.approx(14 * 20e6 / 108e9 + 6 * 40e6 / 12.5e9, rel=1e-9)  # 21.79 ms
    assert nodes.latency_s == pytest.approx(14 * 2 * HOP + 6 * 9e-6)
    assert nodes.time_s < flat.time_s
    assert flat.busiest_link == nodes.busiest_link == ("nic0", "network")
    small = 10**6 // FLOAT32  # at 1 MB latency decides, and the hierarchy wins by more
    ratio_small = (
        predict(ring.allreduce(32, small), t, FLOAT32).time_s
        / predict(hierarchical.allreduce(32, small, 8), t, FLOAT32).time_s
    )
    assert ratio_small > flat.time_s / nodes.time_s > 1


def test_the_ring_topology_gives_the_textbook_ring_time() -> None:
    n = 6
    p = predict(ring.allreduce(n, 6000), ring_topology(n), 8)
    assert p.bandwidth_s == pytest.approx(2 * (n - 1) * 1000 * 8 / 18e9)
    assert sum(s.time_s for s in p.per_step) == pytest.approx(p.time_s)


def test_nothing_moves_for_empty_chunks_or_ranks_on_one_device() -> None:
    t = pcie_switch(4)
    empty = predict(ring.allreduce(4, 0), t, FLOAT32)
    assert (empty.time_s, empty.busiest_link, empty.link_bytes) == (0.0, None, {})
    assert all(s.busiest_link is None and s.bytes_moved == 0 for s in empty.per_step)
    shared = predict(ring.allreduce(2, 100), t, FLOAT32, ["gpu1", "gpu1"])
    assert shared.time_s == 0.0


def test_placements_must_fit() -> None:
    t = pcie_switch(2)
    schedule = Schedule("x", "allreduce", 3, (1,), (Step([Transfer(0, 1, 0)]),))
    with pytest.raises(TopologyError, match="has 2 GPUs, x has 3 ranks; give a placement"):
        predict(schedule, t, 4)
    with pytest.raises(TopologyError, match="placement names 2 devices for 3 ranks"):
        predict(schedule, t, 4, ["gpu0", "gpu1"])
    with pytest.raises(TopologyError, match="no device 'gpu9'"):
        predict(schedule, t, 4, ["gpu0", "gpu1", "gpu9"])
    with pytest.raises(TopologyError, match="itemsize must be at least 1"):
        predict(schedule, t, 0, ["gpu0", "gpu1", "cpu"])


@pytest.mark.parametrize("world_size", [2, 5, 8])
def test_the_cost_model_moves_the_bytes_the_simulator_counts(world_size: int) -> None:
    # fully connected, every transfer is one hop: the links carry exactly what the ranks send
    t = fully_connected(world_size)
    for name, module in ALGORITHMS.items():
        for collective in (c for c in COLLECTIVES if hasattr(module, c)):
            count = 0 if collective == "barrier" else 37 * world_size  # alltoall needs equal shares
            schedule = build_schedule(collective, name, world_size, count)
            p = predict(schedule, t, 8)
            assert len(p.per_step) == simulate(schedule).steps
            assert sum(p.link_bytes.values()) == sum(simulate(schedule).bytes_sent(8)), (name, collective)


# --- the closed alpha-beta-gamma model, on hand-built schedules


def test_traffic_of_a_hand_built_schedule() -> None:
    schedule = Schedule(
        "hand", "allreduce", 3, (4, 0, 2),
        (
            # rank 0 posts two sends (8 elements); the empty chunk 1 is no message
            Step([Transfer(0, 1, 0), Transfer(0, 2, 0), Transfer(2, 0, 2, reduce=True), Transfer(1, 2, 1)]),
            Step([Transfer(1, 0, 1)]),  # only an empty chunk: the step costs nothing
            # rank 0 receives two messages (4 elements) and reduces both, while sending 4
            Step([Transfer(1, 0, 2, reduce=True), Transfer(2, 0, 2, reduce=True), Transfer(0, 1, 0)]),
        ),
    )  # fmt: skip
    assert traffic(schedule) == Traffic(steps=2, messages=4, elements=12, reduced=6)
    # alpha 2 * 4 messages + beta 3 * 48 bytes + gamma 5 * 24 bytes
    assert UNIT.predict(schedule, itemsize=4) == 8 + 144 + 120


def test_each_term_takes_its_own_busiest_rank() -> None:
    # rank 0 posts the most messages, rank 2 receives the most bytes
    schedule = Schedule(
        "skewed", "allreduce", 3, (1, 1, 10),
        (Step([Transfer(0, 1, 0), Transfer(0, 2, 1), Transfer(1, 2, 2, reduce=True)]),),
    )  # fmt: skip
    assert traffic(schedule) == Traffic(steps=1, messages=2, elements=11, reduced=10)
    assert UNIT.predict(schedule, itemsize=2) == 2 * 2 + 3 * 22 + 5 * 20


def test_an_empty_schedule_costs_only_the_call() -> None:
    for schedule in (ring.allreduce(1, 100), ring.allreduce(5, 0)):
        assert traffic(schedule) == Traffic(0, 0, 0, 0)
        assert DEFAULT_MODEL.predict(schedule, 4) == DEFAULT_MODEL.overhead > 0


@pytest.mark.parametrize("world_size", [2, 3, 8, 16])
def test_ring_prediction_is_the_textbook_formula(world_size: int) -> None:
    p, count, size = world_size, world_size * 1000, 4
    s = count * size
    model = CostModel(alpha=7e-6, beta=0.3e-9, gamma=0.2e-9)
    schedule = ring.allreduce(p, count)
    expected = 2 * (p - 1) * model.alpha + 2 * (p - 1) / p * s * model.beta + (p - 1) / p * s * model.gamma
    assert model.predict(schedule, size) == pytest.approx(expected, rel=1e-12)
    for collective in ("reduce_scatter", "allgather"):
        reduces = collective == "reduce_scatter"
        expected = (p - 1) * model.alpha + (p - 1) / p * s * (model.beta + reduces * model.gamma)
        predicted = model.predict(build_schedule(collective, "ring", p, count), size)
        assert predicted == pytest.approx(expected, rel=1e-12)


def test_ring_at_large_sizes_is_bandwidth_bound() -> None:
    p, size = 8, 4
    count = 64 * 1024**2 // size
    model = CostModel(alpha=6e-6, beta=0.1e-9, gamma=0.0)
    bandwidth_term = 2 * (p - 1) / p * count * size * model.beta
    predicted = model.predict(ring.allreduce(p, count), size)
    assert bandwidth_term < predicted < 1.01 * bandwidth_term


@pytest.mark.parametrize("world_size", [2, 5, 8])
def test_traffic_agrees_with_the_simulator_when_every_rank_does_the_same(world_size: int) -> None:
    for collective in ("allreduce", "reduce_scatter", "allgather"):
        schedule = build_schedule(collective, "ring", world_size, 6 * world_size)
        counted, result = traffic(schedule), simulate(schedule)
        assert counted.steps == result.steps
        assert {counted.elements} == set(result.elements_sent)


def test_defaults_are_sane() -> None:
    assert all(0 < v < math.inf for v in (DEFAULT_MODEL.alpha, DEFAULT_MODEL.beta, DEFAULT_MODEL.gamma))
    assert "GB/s" in DEFAULT_MODEL.describe()
