"""Hierarchical allreduce: verified by the simulator for every world size, count and node size."""

import pytest

from collectives.algorithms import build_schedule, hierarchical, ring
from collectives.chunking import even_split
from collectives.selector import Selector
from collectives.simulate import simulate
from collectives.topology.cost_model import DEFAULT_MODEL

from .strategies import WORLD_SIZES, edge_counts


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_hierarchical_meets_the_contract_at_its_documented_cost(world_size: int) -> None:
    for count in edge_counts(world_size):
        schedule = build_schedule("allreduce", "hierarchical", world_size, count)
        result = simulate(schedule)
        expected = hierarchical.cost("allreduce", even_split(count, world_size))
        assert (result.steps, result.elements_sent) == expected, (world_size, count)


@pytest.mark.parametrize("world_size", [6, 12, 32])
def test_every_node_size_that_divides_the_world_works(world_size: int) -> None:
    for local in (g for g in range(1, world_size + 1) if world_size % g == 0):
        for count in (0, world_size - 1, 5 * world_size + 3):
            schedule = hierarchical.allreduce(world_size, count, local)
            result = simulate(schedule)
            expected = hierarchical.cost("allreduce", even_split(count, world_size), local)
            assert (result.steps, result.elements_sent) == expected, (world_size, local, count)


@pytest.mark.parametrize(("world_size", "local"), [(1, 1), (5, 1), (5, 5), (12, 1), (12, 12)])
def test_one_node_or_one_rank_per_node_moves_what_the_ring_does(world_size: int, local: int) -> None:
    count = 7 * world_size + 2
    result = simulate(hierarchical.allreduce(world_size, count, local))
    assert (result.steps, result.elements_sent) == ring.cost("allreduce", even_split(count, world_size))


def test_only_the_rail_phase_crosses_nodes() -> None:
    g, m = 4, 3
    schedule = hierarchical.allreduce(g * m, 120, g)
    assert schedule.name == "allreduce-hierarchical(n=12,local=4)"
    crossing = [
        index
        for index, step in enumerate(schedule.steps)
        if any(t.src // g != t.dst // g for t in step.transfers)
    ]
    assert crossing == list(range(g - 1, g - 1 + 2 * (m - 1)))
    for index in crossing:  # each rank talks to its own local index on the next node
        assert {(t.src % g, (t.dst - t.src) % (g * m)) for t in schedule.steps[index].transfers} == {
            (j, g) for j in range(g)
        }


@pytest.mark.parametrize(
    ("world_size", "expected"), [(1, 1), (2, 1), (4, 2), (12, 3), (32, 4), (33, 3), (13, 1)]
)
def test_the_default_node_size_is_the_largest_divisor_up_to_the_square_root(
    world_size: int, expected: int
) -> None:
    assert hierarchical.default_local_size(world_size) == expected


def test_bad_node_sizes_are_rejected() -> None:
    with pytest.raises(ValueError, match="local size 5 does not divide world size 12"):
        hierarchical.allreduce(12, 10, 5)
    with pytest.raises(ValueError, match="local size 0"):
        hierarchical.allreduce(4, 10, 0)
    with pytest.raises(ValueError, match="no 'reduce_scatter'"):
        hierarchical.cost("reduce_scatter", (1, 1))


@pytest.mark.parametrize(("world_size", "per_node"), [(2, 4), (6, 4), (3, 0)])
def test_the_selector_rejects_nodes_that_do_not_split_the_ranks(world_size: int, per_node: int) -> None:
    features = frozenset({"shared_memory_nodes", f"ranks_per_node={per_node}"})
    explanation = Selector(DEFAULT_MODEL).explain(
        "allreduce", 1 << 20, world_size=world_size, features=features
    )
    rejected = {r.algorithm: r.reasons for r in explanation.rejected}
    assert rejected["hierarchical_shared_memory"] == (
        f"{world_size} ranks do not split into nodes of {per_node}",
    )
    assert explanation.choice != "hierarchical_shared_memory"


def test_the_selector_weighs_nodes_that_split_the_ranks() -> None:
    features = frozenset({"shared_memory_nodes", "ranks_per_node=4"})
    explanation = Selector(DEFAULT_MODEL).explain("allreduce", 1 << 20, world_size=8, features=features)
    assert "hierarchical_shared_memory" in [c.algorithm for c in explanation.candidates]
