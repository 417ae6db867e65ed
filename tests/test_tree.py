"""The binary and double binary trees: shapes, the contract at the documented cost, and loopback runs."""

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives as C
from collectives import Communicator, ScheduleError
from collectives.algorithms import build_schedule, double_tree, tree
from collectives.algorithms.tree import Tree, binary_tree, double_binary_tree, pipeline_chunks
from collectives.backends.numpy_backend import NumpyBackend
from collectives.chunking import even_split
from collectives.execute import execute
from collectives.ops import get_op
from collectives.schedule import Schedule, Step, Transfer
from collectives.simulate import simulate

from .strategies import WORLD_SIZES, edge_counts

Ranks = Callable[..., list[Any]]
MODULES = {"tree": tree, "double_tree": double_tree}
CHUNKS = (None, 1, 2, 3, 8)


def _depth(world_size: int) -> int:
    return world_size.bit_length() - 1  # floor(log2 P)


def _check_spanning(t: Tree, world_size: int) -> None:
    assert t.world_size == world_size
    assert t.parent[t.root] is None
    assert [r for r in range(world_size) if t.parent[r] is None] == [t.root]
    for rank, below in enumerate(t.children):
        assert len(below) <= 2
        for child in below:
            assert t.parent[child] == rank
    # every rank reaches the root, so there are no cycles
    for rank in range(world_size):
        seen = 0
        node: int | None = rank
        while node != t.root:
            assert node is not None
            node = t.parent[node]
            seen += 1
            assert seen < world_size
        assert seen == t.depth[rank]


# The documented roles in closed form, from the rank alone (the tree with its default root).
def _sent_per_element(world_size: int, rank: int) -> int:
    p = world_size
    if p == 1:
        return 0
    if rank == (1 << _depth(p)) - 1:  # the root
        return 1 if p & (p - 1) == 0 else 2
    if rank % 2 == 0:  # a leaf
        return 1
    return 2 if rank == p - 1 else 3


def _second_tree_rank(world_size: int, rank: int) -> int:
    """The rank whose role in the first tree ``rank`` has in the second: the mirror or the shift back."""
    return world_size - 1 - rank if world_size % 2 == 0 else (rank - 1) % world_size


def _shares(count: int, world_size: int) -> tuple[int, ...]:
    return even_split(count, world_size)


@pytest.mark.parametrize("world_size", [*range(1, 65), 127, 128, 129])
def test_the_binary_tree_is_the_documented_shape(world_size: int) -> None:
    p = world_size
    t = binary_tree(p)
    _check_spanning(t, p)
    assert t.root == (1 << _depth(p)) - 1
    assert t.height == _depth(p)
    assert t.interior == {r for r in range(p) if r % 2 == 1}
    expected_children = [0 if r % 2 == 0 else 1 if r == p - 1 else 2 for r in range(p)]
    assert [len(below) for below in t.children] == expected_children


@pytest.mark.parametrize("world_size", [*range(1, 34), 64, 65])
def test_trees_rooted_anywhere_keep_their_shape(world_size: int) -> None:
    for root in range(world_size):
        t = binary_tree(world_size, root)
        _check_spanning(t, world_size)
        assert t.root == root
        assert t.height == _depth(world_size)
        first, second = double_binary_tree(world_size, root)
        assert first == t
        _check_spanning(second, world_size)
        assert not first.interior & second.interior


@pytest.mark.parametrize("world_size", [*range(1, 65), 127, 128, 129])
def test_every_rank_is_interior_in_at_most_one_of_the_double_trees(world_size: int) -> None:
    p = world_size
    first, second = double_binary_tree(p)
    assert first == binary_tree(p)
    _check_spanning(second, p)
    assert second.height == first.height == _depth(p)
    assert not first.interior & second.interior
    # even P: mirrored, so the interiors are exactly complementary; odd P: shifted, rank 0 a leaf in both
    assert first.interior | second.interior == (set(range(p)) if p % 2 == 0 else set(range(1, p)))
    for rank in range(p):
        other = _second_tree_rank(p, rank)
        assert len(second.children[rank]) == len(first.children[other])
        assert (second.root == rank) == (first.root == other)


def test_bad_tree_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="world size must be at least 1, got 0"):
        binary_tree(0)
    with pytest.raises(ValueError, match=r"root 4 is outside 0\.\.3"):
        binary_tree(4, 4)
    with pytest.raises(ValueError, match=r"root -1 is outside 0\.\.3"):
        double_binary_tree(4, -1)
    with pytest.raises(ValueError, match="chunks must be at least 1, got 0"):
        tree.allreduce(4, 10, chunks=0)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", MODULES)
def test_trees_meet_the_contract_at_their_documented_cost(algorithm: str, world_size: int) -> None:
    module = MODULES[algorithm]
    for count in edge_counts(world_size):
        assert build_schedule("allreduce", algorithm, world_size, count) == module.allreduce(
            world_size, count
        )
        for chunks in CHUNKS:
            schedule = module.allreduce(world_size, count, chunks)
            result = simulate(schedule)
            expected = module.cost("allreduce", _shares(count, world_size), chunks)
            assert (result.steps, result.elements_sent) == expected, (schedule.name, count)


def _closed_form(algorithm: str, world_size: int, count: int, chunks: int) -> tuple[int, tuple[int, ...]]:
    """Steps and elements sent per rank from the docstring's tables, independent of the tree code."""
    p, m = world_size, _depth(world_size)
    sizes = even_split(count, chunks)
    if p == 1:
        return 0, (0,)
    if algorithm == "tree":
        return chunks + 2 * m - 1, tuple(count * _sent_per_element(p, r) for r in range(p))
    first = -(-chunks // 2)
    s1, s2 = sum(sizes[:first]), sum(sizes[first:])
    sent = tuple(
        s1 * _sent_per_element(p, r) + s2 * _sent_per_element(p, _second_tree_rank(p, r)) for r in range(p)
    )
    return first + 2 * m - 1, sent


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", MODULES)
def test_the_simulated_cost_is_the_closed_form(algorithm: str, world_size: int) -> None:
    for count in (*edge_counts(world_size), 1000):
        for chunks in (1, 2, 3, 8, pipeline_chunks(count)):
            result = simulate(MODULES[algorithm].allreduce(world_size, count, chunks))
            assert (result.steps, result.elements_sent) == _closed_form(algorithm, world_size, count, chunks)


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(WORLD_SIZES),
    st.integers(0, 300),
    st.integers(1, 40),
    st.sampled_from(sorted(MODULES)),
)
def test_any_pipelining_depth_meets_the_contract(world_size: int, count: int, chunks: int, name: str) -> None:
    result = simulate(MODULES[name].allreduce(world_size, count, chunks))
    assert (result.steps, result.elements_sent) == _closed_form(name, world_size, count, chunks)


@pytest.mark.parametrize("world_size", [2, 3, 8, 13, 32])
def test_the_double_tree_halves_the_busiest_ranks_traffic(world_size: int) -> None:
    count = 1200
    one = simulate(tree.allreduce(world_size, count, 8)).elements_sent
    two = simulate(double_tree.allreduce(world_size, count, 8)).elements_sent
    assert max(one) == {2: 1, 3: 2}.get(world_size, 3) * count  # an interior rank's 3 S
    assert max(two) <= 2 * count
    assert sum(one) == sum(two) == 2 * (world_size - 1) * count


def test_the_default_pipelining_depth_grows_with_the_square_root_of_the_count() -> None:
    counts = (0, 1, 2**18 - 1, 2**18, 2**20, 2**22, 2**40)
    assert [pipeline_chunks(n) for n in counts] == [1, 1, 1, 2, 4, 8, 64]
    assert tree.allreduce(4, 2**22).name == "allreduce-tree(n=4,chunks=8)"
    assert double_tree.allreduce(4, 2**22).name == "allreduce-double_tree(n=4,chunks=8)"
    with pytest.raises(ValueError, match="count must be non-negative, got -1"):
        pipeline_chunks(-1)


@pytest.mark.parametrize("world_size", [2, 5, 8, 13])
def test_chunks_stream_one_level_a_step(world_size: int) -> None:
    # at step s a rank at depth d sends chunk s - (m - d) up and chunk s - m - d down
    chunks = 6
    t = binary_tree(world_size)
    m = t.height
    schedule = tree.allreduce(world_size, 60, chunks)
    for s, step in enumerate(schedule.steps):
        for x in step.transfers:
            if x.reduce:
                assert t.parent[x.src] == x.dst and x.chunk == s - (m - t.depth[x.src])
            else:
                assert t.parent[x.dst] == x.src and x.chunk == s - m - t.depth[x.src]
    # the two trees of the double tree run at once, on their own chunks
    second = double_binary_tree(world_size)[1]
    both = double_tree.allreduce(world_size, 60, chunks)
    ups = {(x.src, x.dst) for step in both.steps for x in step.transfers if x.reduce and x.chunk >= 3}
    assert ups == {(r, second.parent[r]) for r in range(world_size) if r != second.root}
    assert len(both.steps) == chunks // 2 + 2 * m - 1


def _replace_step(schedule: Schedule, index: int, transfers: list[Transfer]) -> Schedule:
    steps = list(schedule.steps)
    steps[index] = Step(transfers)
    return replace(schedule, steps=tuple(steps))


def test_a_missing_reduction_is_named() -> None:
    schedule = tree.allreduce(5, 10, 2)  # root 3 over 1 and 4; 1 over 0 and 2
    first = list(schedule.steps[0].transfers)
    first.remove(Transfer(0, 1, 0, reduce=True))
    missing = r"rank 0 ends with chunk 0 holding contributions of ranks \{1, 2, 3, 4\}, expected"
    with pytest.raises(ScheduleError, match=missing) as caught:
        simulate(_replace_step(schedule, 0, first))
    assert (caught.value.rank, caught.value.chunk) == (0, 0)


def test_a_broadcast_before_the_sum_is_complete_is_rejected() -> None:
    schedule = tree.allreduce(5, 10, 2)
    # the root sends chunk 0 down at step 2; at step 1 its children are still sending chunk 0 up
    early = [x for x in schedule.steps[2].transfers if x.src == 3 and x.chunk == 0]
    assert [(x.dst, x.reduce) for x in early] == [(1, False), (4, False)]
    with pytest.raises(
        ScheduleError, match="step 1: rank 1 overwrites chunk 0 while also receiving or sending"
    ):
        _replace_step(schedule, 1, [*schedule.steps[1].transfers, *early])


def test_a_copy_onto_a_chunk_being_reduced_is_rejected() -> None:
    schedule = tree.allreduce(3, 6, 2)  # root 1 over 0 and 2
    with pytest.raises(
        ScheduleError, match="step 0: rank 1 overwrites chunk 0 while also receiving or sending"
    ):
        _replace_step(schedule, 0, [*schedule.steps[0].transfers, Transfer(0, 1, 0)])


def test_a_reduction_counted_twice_is_named() -> None:
    schedule = tree.allreduce(3, 6, 2)
    doubled = [*schedule.steps[0].transfers, Transfer(0, 1, 0, reduce=True)]
    with pytest.raises(
        ScheduleError, match=r"step 0: rank 1 reduces chunk 0 twice: contributions of ranks \{0\}"
    ):
        simulate(_replace_step(schedule, 0, doubled))


def _tree_sum(t: Tree, inputs: list[np.ndarray], rank: int) -> np.ndarray:
    """What the root's reduction computes below ``rank``: its own input, then each child's, in order."""
    total = inputs[rank].copy()
    for child in t.children[rank]:
        total += _tree_sum(t, inputs, child)
    return total


def _run(ranks: Ranks, schedule: Schedule, inputs: list[np.ndarray], op: str = "sum") -> list[np.ndarray]:
    def body(comm: Communicator) -> np.ndarray:
        buffer = inputs[comm.rank].copy()
        execute(schedule, comm.transport, NumpyBackend(), buffer, get_op(op))
        return buffer

    results: list[np.ndarray] = ranks(schedule.world_size, body)
    return results


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8, 13])
@pytest.mark.parametrize("chunks", [1, 4, 7])
def test_every_rank_ends_with_the_roots_bits(ranks: Ranks, world_size: int, dtype: str, chunks: int) -> None:
    rng = np.random.default_rng(world_size * 100 + chunks)
    inputs = [rng.standard_normal(1003).astype(dtype) for _ in range(world_size)]
    exact = sum(x.astype(np.float64) for x in inputs)
    for name, module in MODULES.items():
        schedule = module.allreduce(world_size, 1003, chunks)
        results = _run(ranks, schedule, inputs)
        assert all(r.tobytes() == results[0].tobytes() for r in results), name
        assert np.allclose(results[0], exact, atol=1e-3), name
        assert _run(ranks, schedule, inputs)[0].tobytes() == results[0].tobytes(), name
    # the binary tree adds in its documented order: own, first child, second child
    t = binary_tree(world_size)
    expected = _tree_sum(t, inputs, t.root)
    assert _run(ranks, tree.allreduce(world_size, 1003, chunks), inputs)[0].tobytes() == expected.tobytes()


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 6, 7, 9])
@pytest.mark.parametrize("algorithm", MODULES)
def test_integers_are_exact_through_the_api(ranks: Ranks, world_size: int, algorithm: str) -> None:
    for count in (*edge_counts(world_size), 600_000):  # pipelined in 3 chunks by default
        inputs = [np.arange(count, dtype=np.int64) * (r + 1) - r for r in range(world_size)]
        expected = sum(inputs, np.zeros(count, np.int64))
        maxima = np.max(np.stack(inputs), axis=0)

        def run(comm: Communicator, xs: list[np.ndarray] = inputs) -> tuple[np.ndarray, np.ndarray]:
            x = xs[comm.rank].astype(np.int32)
            in_place = x.copy()
            C.allreduce(in_place, "max", out=in_place, algorithm=algorithm, comm=comm)
            return C.allreduce(xs[comm.rank], algorithm=algorithm, comm=comm), in_place

        for total, biggest in ranks(world_size, run):
            assert np.array_equal(total, expected), (count, algorithm)
            assert np.array_equal(biggest, maxima.astype(np.int32)), (count, algorithm)


def test_the_registry_names_both_trees() -> None:
    from collectives.algorithms import ALGORITHMS

    modules: dict[str, ModuleType] = {name: ALGORITHMS[name] for name in MODULES}
    assert modules == MODULES
    with pytest.raises(C.UnknownAlgorithmError, match="valid algorithms are ring, tree, double_tree"):
        build_schedule("allreduce", "trees", 4, 8)
