"""The ring: verified by the simulator for every world size and awkward count, at its documented cost."""

import pytest
from hypothesis import given, settings

from collectives.algorithms import build_schedule, ring
from collectives.chunking import even_split
from collectives.simulate import simulate
from collectives.specs import get_spec

from .strategies import WORLD_SIZES, edge_counts, shares


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather"])
def test_ring_meets_the_contract_at_its_documented_cost(collective: str, world_size: int) -> None:
    for count in edge_counts(world_size):
        schedule = build_schedule(collective, "ring", world_size, count)
        result = simulate(schedule)
        expected = ring.cost(collective, even_split(count, world_size))
        assert (result.steps, result.elements_sent) == expected, (collective, world_size, count)


@pytest.mark.parametrize("world_size", [2, 3, 8, 33])
def test_ring_moves_the_textbook_share_when_p_divides_the_count(world_size: int) -> None:
    count = 12 * world_size
    p = world_size
    allreduce = simulate(ring.allreduce(p, count))
    assert allreduce.steps == 2 * (p - 1)
    assert set(allreduce.elements_sent) == {2 * (p - 1) * count // p}
    for collective in ("reduce_scatter", "allgather"):
        result = simulate(build_schedule(collective, "ring", p, count))
        assert result.steps == p - 1
        assert set(result.elements_sent) == {(p - 1) * count // p}


@settings(max_examples=150, deadline=None)
@given(shares())
def test_ring_with_unequal_shares_meets_the_contract(counts: tuple[int, ...]) -> None:
    for collective in ("reduce_scatter", "allgather"):
        schedule = build_schedule(collective, "ring", len(counts), sum(counts), counts)
        result = simulate(schedule)
        assert get_spec(collective).shares(schedule) == counts
        assert (result.steps, result.elements_sent) == ring.cost(collective, counts)


def test_every_rank_sends_only_to_its_right_neighbour() -> None:
    for schedule in (ring.allreduce(5, 7), ring.reduce_scatter((1,) * 5), ring.allgather((2,) * 5)):
        for step in schedule.steps:
            assert sorted((t.src, t.dst) for t in step.transfers) == [(r, (r + 1) % 5) for r in range(5)]
