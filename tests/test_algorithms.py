"""Every registered algorithm, and the topology's own schedules, survive a JSON round trip unchanged."""

import pytest

from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical, multi_ring
from collectives.schedule import Schedule
from collectives.specs import COLLECTIVES
from collectives.topology import dgx1, pack_rings
from collectives.topology.strategies import split_star, star

REGISTERED = [(name, c) for name, module in ALGORITHMS.items() for c in COLLECTIVES if hasattr(module, c)]


def _round_trips(schedule: Schedule) -> None:
    text = schedule.to_json()
    again = Schedule.from_json(text)
    assert again == schedule
    assert again.to_json() == text


def test_the_topology_algorithms_are_registered() -> None:
    assert {"ring", "multi_ring", "hierarchical"} <= set(ALGORITHMS)
    assert ("hierarchical", "allreduce") in REGISTERED
    assert {("multi_ring", c) for c in ("allreduce", "reduce_scatter", "allgather")} <= set(REGISTERED)


@pytest.mark.parametrize(("algorithm", "collective"), REGISTERED)
def test_every_registered_algorithm_survives_a_json_round_trip(algorithm: str, collective: str) -> None:
    for world_size in (1, 2, 5, 8, 12):
        for count in (0, 3, 3 * world_size, 4 * world_size + 1):
            if (collective == "alltoall" and count % world_size) or (collective == "barrier" and count):
                continue  # alltoall sends every rank an equal share; a barrier moves no data
            _round_trips(build_schedule(collective, algorithm, world_size, count, root=world_size - 1))


def test_schedules_built_for_a_topology_survive_a_json_round_trip() -> None:
    packing = pack_rings(dgx1())
    rings = packing.rank_rings()
    _round_trips(multi_ring.allreduce(8, 1001, rings, packing.bandwidths, bidirectional=True))
    _round_trips(multi_ring.reduce_scatter((7, 0, 3, 9, 1, 1, 2, 5), rings, packing.bandwidths))
    _round_trips(hierarchical.allreduce(32, 999, local_size=8))
    _round_trips(star(5, 77, root=4))
    _round_trips(split_star(4, 77))
