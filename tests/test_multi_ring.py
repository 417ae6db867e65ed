"""Multi-ring: verified by the simulator for every world size, count and choice of rings, at its cost."""

import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives.algorithms import build_schedule, multi_ring, ring
from collectives.chunking import even_split
from collectives.schedule import Schedule
from collectives.simulate import simulate
from collectives.specs import get_spec

from .strategies import WORLD_SIZES, edge_counts

COLLECTIVES = ("allreduce", "reduce_scatter", "allgather")


def _build(collective: str, shares: tuple[int, ...], **options: Any) -> Schedule:
    if collective == "allreduce":
        return multi_ring.allreduce(len(shares), sum(shares), **options)
    builder = multi_ring.reduce_scatter if collective == "reduce_scatter" else multi_ring.allgather
    return builder(shares, **options)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", COLLECTIVES)
def test_the_default_bidirectional_ring_meets_the_contract_at_its_documented_cost(
    collective: str, world_size: int
) -> None:
    for count in edge_counts(world_size):
        schedule = build_schedule(collective, "multi_ring", world_size, count)
        result = simulate(schedule)
        expected = multi_ring.cost(collective, even_split(count, world_size))
        assert (result.steps, result.elements_sent) == expected, (collective, world_size, count)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_three_weighted_rings_meet_the_contract_at_their_documented_cost(world_size: int) -> None:
    ranks = list(range(world_size))
    rings = [ranks, random.Random(world_size).sample(ranks, world_size), ranks[::-1]]
    for count in edge_counts(world_size):
        schedule = multi_ring.allreduce(world_size, count, rings, weights=[3, 2, 1])
        result = simulate(schedule)
        expected = multi_ring.cost("allreduce", even_split(count, world_size), rings, weights=[3, 2, 1])
        assert (result.steps, result.elements_sent) == expected, (world_size, count)


@st.composite
def _rings(draw: st.DrawFn) -> tuple[tuple[int, ...], list[list[int]], list[float], bool]:
    size = draw(st.integers(1, 12))
    shares = tuple(draw(st.lists(st.integers(0, 30), min_size=size, max_size=size)))
    k = draw(st.integers(1, 3))
    rings = [draw(st.permutations(range(size))) for _ in range(k)]
    weights = [draw(st.floats(0.1, 10.0)) for _ in range(k)]
    return shares, rings, weights, draw(st.booleans())


@settings(max_examples=120, deadline=None)
@given(_rings(), st.sampled_from(COLLECTIVES))
def test_any_rings_weights_and_shares_meet_the_contract(
    case: tuple[tuple[int, ...], list[list[int]], list[float], bool], collective: str
) -> None:
    shares, rings, weights, both = case
    if collective == "allreduce":
        shares = even_split(sum(shares), len(shares))
    options: dict[str, Any] = {"rings": rings, "weights": weights, "bidirectional": both}
    schedule = _build(collective, shares, **options)
    result = simulate(schedule)
    assert (result.steps, result.elements_sent) == multi_ring.cost(collective, shares, **options)
    if collective != "allreduce":
        assert get_spec(collective).shares(schedule) == shares


@pytest.mark.parametrize("collective", COLLECTIVES)
def test_one_ring_in_order_moves_what_the_ring_does(collective: str) -> None:
    shares = (5, 3, 4, 0, 7)
    if collective == "allreduce":
        shares = even_split(sum(shares), 5)
    one = simulate(_build(collective, shares, rings=[range(5)]))
    assert (one.steps, one.elements_sent) == ring.cost(collective, shares)


def test_every_step_sends_one_message_per_ring_along_its_ring() -> None:
    rings = [(0, 2, 1, 3), (3, 1, 0, 2)]
    schedule = multi_ring.allreduce(4, 40, rings=rings, weights=[2, 1])
    hops = {(r[p], r[(p + 1) % 4]) for r in rings for p in range(4)}
    for step in schedule.steps:
        assert len(step.transfers) == 8
        assert {(t.src, t.dst) for t in step.transfers} == hops


def test_weights_split_every_share_between_the_rings() -> None:
    schedule = multi_ring.reduce_scatter((30, 30, 31), rings=[(0, 1, 2), (0, 2, 1)], weights=[2, 1])
    assert schedule.chunk_sizes == (20, 10, 20, 10, 21, 10)
    assert schedule.chunk_owner == (0, 0, 1, 1, 2, 2)


def test_bidirectional_adds_each_ring_reversed_with_its_weight() -> None:
    schedule = multi_ring.allreduce(3, 9, rings=[(0, 2, 1)], weights=[1], bidirectional=True)
    assert schedule.name == "allreduce-multi_ring(n=3,rings=0-2-1:1,1-2-0:1)"
    default = multi_ring.allreduce(3, 9)
    assert default.name == "allreduce-multi_ring(n=3)"  # the same schedule has the same name
    assert multi_ring.allreduce(3, 9, rings=[(0, 1, 2), (2, 1, 0)], weights=[4, 4]) == default
    assert multi_ring.allreduce(3, 9, rings=[(0, 1, 2)], bidirectional=True) == default
    weighted = multi_ring.allreduce(8, 9, rings=[range(8), (0, 2, 4, 6, 1, 3, 5, 7)], weights=[36, 18])
    assert weighted.name == "allreduce-multi_ring(n=8,rings=0-1-2-3-4-5-6-7:2,0-2-4-6-1-3-5-7:1)"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"rings": []}, "at least one ring"),
        ({"rings": [(0, 1, 1)]}, r"ring \(0, 1, 1\) is not an order of ranks 0..2"),
        ({"rings": [(0, 1, 2)], "weights": [1, 2]}, "2 weights for 1 rings"),
        ({"rings": [(0, 1, 2)], "weights": [0]}, "weights must be positive"),
    ],
)
def test_bad_rings_and_weights_are_rejected(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        multi_ring.allreduce(3, 6, **options)
    with pytest.raises(ValueError, match="no 'broadcast'"):
        multi_ring.cost("broadcast", (1, 2, 3))
