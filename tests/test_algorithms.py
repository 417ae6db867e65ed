"""Every registered algorithm provides what algorithms/base.py says and survives a JSON round trip."""

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from collectives.algorithms import (
    ALGORITHMS,
    base,
    build_schedule,
    hierarchical,
    hierarchical_shared_memory,
    multi_ring,
    ring,
    shared_memory,
)
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


# --- what an algorithm provides (collectives/algorithms/base.py)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_every_registered_algorithm_provides_what_base_says(name: str) -> None:
    module = ALGORITHMS[name]
    assert callable(module.cost)
    assert [c for c in COLLECTIVES if base.implements(module, c)], f"{name} builds no collective"
    assert all(base.builder(module, c) is getattr(module, c, None) for c in COLLECTIVES)
    needs = base.required_feature(module)
    # an algorithm that needs a feature says so in words, for the selector's reasons and the docs
    assert (needs is None) == (base.requirements_text(module) is None)


def test_the_hooks_are_found_where_a_module_defines_them() -> None:
    assert base.builder(ring, "allreduce") is ring.allreduce
    assert base.builder(ring, "barrier") is None and not base.implements(ring, "barrier")
    assert not base.implements(None, "allreduce")  # an unknown name looked up with ALGORITHMS.get
    assert base.required_feature(ring) is None and base.requirements_text(ring) is None
    assert base.required_feature(shared_memory) == "shared_memory"
    assert base.requires(shared_memory, "shared_memory") and not base.requires(ring, "shared_memory")
    assert base.required_feature(hierarchical_shared_memory) == "shared_memory_nodes"
    assert not base.requires(hierarchical_shared_memory, "shared_memory")
    assert base.requirements_text(shared_memory) == "ranks on one node"
    assert base.topology_builder(multi_ring) is multi_ring.for_topology
    assert base.topology_builder(hierarchical) is hierarchical.for_topology
    assert base.topology_builder(ring) is None
    assert base.traffic_counter(shared_memory) is shared_memory.traffic
    assert base.traffic_counter(ring) is None
    assert base.unsupported_reasons(ring, "allreduce", 4, 10, frozenset()) == []
    nodes_of_3 = frozenset({"shared_memory_nodes", "ranks_per_node=3"})
    assert base.unsupported_reasons(hierarchical_shared_memory, "allreduce", 8, 10, nodes_of_3)
    assert base.unsupported_reasons(hierarchical_shared_memory, "allreduce", 9, 10, nodes_of_3) == []
    # a module-like object will do, as tests register them
    fake = SimpleNamespace(
        allreduce=ring.allreduce, REQUIRES="shared_memory", not_supported_reasons=lambda *a: ["no"]
    )
    assert base.implements(fake, "allreduce") and base.requires(fake, "shared_memory")
    assert base.unsupported_reasons(fake, "allreduce", 2, 2, frozenset()) == ["no"]


def test_only_base_reads_an_algorithms_hooks_by_name() -> None:
    root = Path(__file__).resolve().parent.parent
    hooks = r"getattr\([^()]*\"(REQUIRES|REQUIRES_TEXT|for_topology|not_supported_reasons|traffic)\""
    readers = sorted(
        str(path.relative_to(root))
        for folder in ("collectives", "bench")
        for path in (root / folder).rglob("*.py")
        if re.search(hooks, path.read_text())
    )
    assert readers == ["collectives/algorithms/base.py"]
