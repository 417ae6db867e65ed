"""Direct and dissemination algorithms, and the ring broadcast: verified and at their documented cost."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectives import InvalidRootError, UnknownAlgorithmError
from collectives.algorithms import ALGORITHMS, build_schedule, direct, dissemination, ring
from collectives.chunking import even_split
from collectives.simulate import simulate
from collectives.specs import COLLECTIVES, get_spec

from .strategies import WORLD_SIZES, edge_counts, shares

DIRECT = [name for name in COLLECTIVES if hasattr(direct, name)]


def _roots(collective: str, world_size: int) -> list[int]:
    """Roots to try: the first, a middle and the last rank; 0 alone for the collectives without."""
    if not get_spec(collective).rooted:
        return [0]
    return sorted({0, world_size // 2, world_size - 1})


def _counts(collective: str, world_size: int) -> list[int]:
    """Edge counts; alltoall's are whole shares for every rank, and the barrier moves nothing."""
    if collective == "barrier":
        return [0]
    if collective == "alltoall":
        return [world_size * share for share in edge_counts(world_size)]
    return list(edge_counts(world_size))


def test_direct_implements_every_collective() -> None:
    assert list(COLLECTIVES) == DIRECT


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("collective", DIRECT)
def test_direct_meets_the_contract_at_its_documented_cost(collective: str, world_size: int) -> None:
    for count in _counts(collective, world_size):
        for root in _roots(collective, world_size):
            schedule = build_schedule(collective, "direct", world_size, count, root=root)
            result = simulate(schedule)
            expected = direct.cost(collective, even_split(count, world_size), root)
            assert (result.steps, result.elements_sent) == expected, (collective, world_size, count, root)


@pytest.mark.parametrize("world_size", [2, 3, 8, 33])
def test_direct_moves_the_textbook_amounts(world_size: int) -> None:
    p, s = world_size, 12 * world_size
    root = p - 1
    others = [r for r in range(p) if r != root]
    broadcast = simulate(direct.broadcast(p, s, root))
    assert broadcast.steps == 1 and broadcast.elements_sent[root] == (p - 1) * s
    reduce = simulate(direct.reduce(p, s, root))
    assert reduce.elements_received[root] == (p - 1) * s and reduce.elements_sent[root] == 0
    gather = simulate(build_schedule("gather", "direct", p, s, root=root))
    assert gather.elements_received[root] == (p - 1) * s // p
    assert {gather.elements_sent[r] for r in others} == {s // p}
    allreduce = simulate(direct.allreduce(p, s))
    assert allreduce.steps == 2 and set(allreduce.elements_sent[1:]) == {s}
    alltoall = simulate(direct.alltoall(p, s))
    assert alltoall.steps == p - 1 and set(alltoall.elements_sent) == {(p - 1) * s // p}
    assert set(alltoall.messages_sent) == {p - 1}


@settings(max_examples=100, deadline=None)
@given(shares(), st.data())
def test_direct_with_unequal_shares_and_any_root(counts: tuple[int, ...], data: st.DataObject) -> None:
    size, total = len(counts), sum(counts)
    root = data.draw(st.integers(0, size - 1))
    for collective in ("reduce_scatter", "allgather", "gather", "scatter"):
        schedule = build_schedule(collective, "direct", size, total, counts, root=root)
        result = simulate(schedule)
        assert get_spec(collective).shares(schedule) == counts
        assert (result.steps, result.elements_sent) == direct.cost(collective, counts, root)


def test_the_star_centres_on_the_root_and_alltoall_pairs_ranks() -> None:
    for schedule in (direct.broadcast(5, 7, 3), direct.gather((1,) * 5, 2), direct.reduce(5, 4, 4)):
        for step in schedule.steps:
            assert all(schedule.root in (t.src, t.dst) for t in step.transfers)
    for schedule in (direct.allreduce(5, 7), direct.allgather((2,) * 5), direct.barrier(5)):
        assert all(0 in (t.src, t.dst) for step in schedule.steps for t in step.transfers)
    for step in direct.alltoall(5, 10).steps:
        assert (
            sorted(t.src for t in step.transfers) == sorted(t.dst for t in step.transfers) == [0, 1, 2, 3, 4]
        )


def test_names_carry_the_parameters() -> None:
    assert direct.broadcast(8, 10, 3).name == "broadcast-direct(n=8, root=3)"
    assert direct.alltoall(4, 8).name == "alltoall-direct(n=4)"
    assert ring.broadcast(4, 8, 1).name == "broadcast-ring(n=4, root=1)"
    assert dissemination.barrier(6).name == "barrier-dissemination(n=6)"


def test_alltoall_needs_whole_shares() -> None:
    with pytest.raises(ValueError, match="alltoall needs a count divisible by the world size 3, got 7"):
        build_schedule("alltoall", "direct", 3, 7)


def test_build_schedule_checks_the_root_and_the_barrier_count() -> None:
    assert build_schedule("gather", "direct", 4, 8, root=3).root == 3
    # the collectives without a root ignore it, and share one cached schedule
    assert build_schedule("allreduce", "direct", 4, 8, root=2) is build_schedule("allreduce", "direct", 4, 8)
    with pytest.raises(InvalidRootError, match=r"root 4 is not a rank: valid roots are 0\.\.3"):
        build_schedule("broadcast", "direct", 4, 8, root=4)
    with pytest.raises(ValueError, match="barrier moves no data; count must be 0, got 1"):
        build_schedule("barrier", "direct", 4, 1)
    with pytest.raises(UnknownAlgorithmError, match="valid algorithms are direct, dissemination"):
        build_schedule("barrier", "ring", 4, 0)
    with pytest.raises(UnknownAlgorithmError, match=r"valid algorithms are ring, direct, shared_memory$"):
        build_schedule("broadcast", "dissemination", 4, 8)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_dissemination_barrier_takes_ceil_log2_rounds(world_size: int) -> None:
    schedule = build_schedule("barrier", "dissemination", world_size, 0)
    result = simulate(schedule)
    rounds = 0
    while 2**rounds < world_size:
        rounds += 1
    assert (result.steps, result.elements_sent) == dissemination.cost("barrier", (1,) * world_size)
    assert result.steps == rounds
    assert set(result.messages_sent) <= {rounds}


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_ring_broadcast_meets_the_contract_at_its_documented_cost(world_size: int) -> None:
    for count in edge_counts(world_size):
        for root in _roots("broadcast", world_size):
            result = simulate(build_schedule("broadcast", "ring", world_size, count, root=root))
            expected = ring.cost("broadcast", even_split(count, world_size), root)
            assert (result.steps, result.elements_sent) == expected, (world_size, count, root)


def test_ring_broadcast_passes_chunks_along_the_chain() -> None:
    schedule = ring.broadcast(4, 8, 2)
    links = {(t.src, t.dst) for step in schedule.steps for t in step.transfers}
    assert links == {(2, 3), (3, 0), (0, 1)}
    # the root starts a new chunk every step until it has sent them all
    assert [[t.chunk for t in step.transfers if t.src == 2] for step in schedule.steps[:5]] == [
        [0], [1], [2], [3], []
    ]  # fmt: skip


def test_every_registered_algorithm_documents_its_cost_and_the_simulator_agrees() -> None:
    world_size = 3
    for name, module in ALGORITHMS.items():
        assert "cost" in (module.__doc__ or "").lower(), name
        for collective in (c for c in COLLECTIVES if hasattr(module, c)):
            rooted = get_spec(collective).rooted
            count = 0 if collective == "barrier" else 6
            schedule = build_schedule(collective, name, world_size, count, root=1)
            result = simulate(schedule)
            options = {"root": 1} if rooted else {}
            shares = (1,) * world_size if collective == "barrier" else even_split(count, world_size)
            expected = module.cost(collective, shares, **options)
            assert (result.steps, result.elements_sent) == expected, (name, collective)
