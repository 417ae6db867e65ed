"""The user's API on loopback ranks: results, in place and out of place, shapes, and errors."""

from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import collectives as C
from collectives import (
    Communicator,
    InvalidBufferError,
    UnknownAlgorithmError,
    UnsupportedDtypeError,
    UnsupportedOpError,
)
from collectives.ops import DTYPES, OPS
from collectives.specs import exact_pattern

from .conftest import run_ranks
from .strategies import shares

Ranks = Callable[..., list[Any]]
OP_DTYPES = [(op, dtype) for op in OPS for dtype in DTYPES if dtype in OPS[op].dtypes]


def _dtype(name: str) -> np.dtype[Any]:
    return np.dtype(ml_dtypes.bfloat16) if name == "bfloat16" else np.dtype(name)


def _pattern_inputs(op: str, dtype: str, world_size: int, count: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Each rank's exact input, and the expected result."""
    pattern = exact_pattern(op, world_size)
    period = len(pattern.values)
    index = np.arange(count)
    inputs = [np.take(pattern.values, (index + r) % period).astype(_dtype(dtype)) for r in range(world_size)]
    expected = np.take(pattern.combined, index % period).astype(_dtype(dtype))
    if OPS[op].averages:
        expected = expected / np.array(world_size, dtype=expected.dtype)
    return inputs, expected


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize(("op", "dtype"), OP_DTYPES)
def test_allreduce_every_op_and_dtype(ranks: Ranks, op: str, dtype: str) -> None:
    for world_size, count in [(1, 5), (3, 2), (4, 37)]:
        inputs, expected = _pattern_inputs(op, dtype, world_size, count)
        results = ranks(world_size, lambda comm, xs=inputs: C.allreduce(xs[comm.rank], op, comm=comm))
        assert all(_same_bits(r, expected) for r in results), (world_size, count, results, expected)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8])
def test_allreduce_edge_counts_in_place_and_out_of_place(ranks: Ranks, world_size: int) -> None:
    for count in sorted({0, 1, world_size - 1, world_size + 1, 3 * world_size + 2}):
        inputs, expected = _pattern_inputs("sum", "int32", world_size, count)
        originals = [x.copy() for x in inputs]

        def run(comm: Communicator, xs: list[np.ndarray] = inputs) -> tuple[np.ndarray, ...]:
            x = xs[comm.rank]
            fresh = C.allreduce(x, comm=comm)
            out = np.full_like(x, -1)
            given = C.allreduce(x, out=out, comm=comm)
            assert given is out
            in_place = x.copy()
            assert C.allreduce(in_place, out=in_place, comm=comm) is in_place
            return fresh, out, in_place

        for rank, results in enumerate(ranks(world_size, run)):
            assert all(_same_bits(r, expected) for r in results), (world_size, count, rank)
            assert _same_bits(inputs[rank], originals[rank])  # out-of-place leaves x alone


def test_allreduce_keeps_the_shape_and_takes_non_contiguous_arrays(ranks: Ranks) -> None:
    base = [np.arange(60, dtype=np.float64).reshape(6, 10) * (r + 1) for r in range(3)]
    expected = sum(b[:, ::3] for b in base)

    def run(comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        strided = base[comm.rank][:, ::3]
        result = C.allreduce(strided, comm=comm)
        out = np.zeros((4, 6)).T  # a non-contiguous out
        C.allreduce(strided, out=out, comm=comm)
        in_place = base[comm.rank].copy()[:, ::3]
        C.allreduce(in_place, out=in_place, comm=comm)
        return result, out, in_place

    for results in ranks(3, run):
        for result in results:
            assert result.shape == (6, 4)
            assert np.array_equal(result, expected)


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 7])
def test_reduce_scatter_gives_each_rank_its_rows(ranks: Ranks, world_size: int) -> None:
    inputs, expected = _pattern_inputs("max", "int16", world_size, world_size * 3 * 2)
    shaped = [x.reshape(world_size * 3, 2) for x in inputs]
    full = expected.reshape(world_size * 3, 2)

    def run(comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        out = np.empty((3, 2), np.int16)
        C.reduce_scatter(shaped[comm.rank], "max", out=out, comm=comm)
        return C.reduce_scatter(shaped[comm.rank], "max", comm=comm), out

    for rank, results in enumerate(ranks(world_size, run)):
        for result in results:
            assert _same_bits(result, full[3 * rank : 3 * rank + 3])


def test_reduce_scatter_with_unequal_counts_and_avg(ranks: Ranks) -> None:
    counts = (3, 0, 5, 1)
    inputs, expected = _pattern_inputs("avg", "float32", 4, sum(counts))
    starts = np.cumsum((0, *counts))
    results = ranks(4, lambda comm: C.reduce_scatter(inputs[comm.rank], "avg", counts=counts, comm=comm))
    for rank, result in enumerate(results):
        assert _same_bits(result, expected[starts[rank] : starts[rank + 1]])


@pytest.mark.parametrize("world_size", [1, 2, 3, 6])
def test_allgather_concatenates_in_rank_order(ranks: Ranks, world_size: int) -> None:
    inputs = [np.full((2, 3), r, dtype=np.uint8) for r in range(world_size)]
    expected = np.concatenate(inputs)

    def run(comm: Communicator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        x = inputs[comm.rank]
        out = np.empty((2 * world_size, 3), np.uint8)
        C.allgather(x, out=out, comm=comm)
        # in place: the rank's input already sits in its slot of out
        in_place = np.zeros_like(out)
        in_place[2 * comm.rank : 2 * comm.rank + 2] = x
        C.allgather(in_place[2 * comm.rank : 2 * comm.rank + 2], out=in_place, comm=comm)
        return C.allgather(x, comm=comm), out, in_place

    for results in ranks(world_size, run):
        assert all(_same_bits(r, expected) for r in results)


def test_allgather_of_scalars_and_unequal_counts(ranks: Ranks) -> None:
    scalars = ranks(3, lambda comm: C.allgather(np.array(comm.rank * 1.5), comm=comm))
    assert all(np.array_equal(s, [0.0, 1.5, 3.0]) for s in scalars)
    counts = (2, 0, 3)
    pieces = [np.arange(c, dtype=np.int64) + 10 * r for r, c in enumerate(counts)]
    results = ranks(3, lambda comm: C.allgather(pieces[comm.rank], counts=counts, comm=comm))
    assert all(np.array_equal(r, [0, 1, 20, 21, 22]) for r in results)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_results_are_bitwise_identical_on_every_rank_and_every_run(ranks: Ranks, dtype: str) -> None:
    world_size = 5
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal(103).astype(_dtype(dtype)) for _ in range(world_size)]
    first = ranks(world_size, lambda comm: C.allreduce(inputs[comm.rank], comm=comm))
    again = ranks(world_size, lambda comm: C.allreduce(inputs[comm.rank], comm=comm))
    assert all(_same_bits(r, first[0]) for r in first + again)
    assert np.allclose(first[0].astype(np.float64), sum(x.astype(np.float64) for x in inputs), atol=0.1)


def _one_rank(call: Callable[[Communicator], Any]) -> Any:
    from collectives.transport.loopback import LoopbackWorld

    return call(Communicator(LoopbackWorld(1).transport(0)))


@pytest.mark.parametrize(
    ("array", "message"),
    [
        (np.zeros(3, np.complex64), "unsupported dtype complex64"),
        (np.zeros(3, bool), "unsupported dtype bool"),
        (np.array(["a"], object), "unsupported dtype object"),
        (np.zeros(3, ">f4"), "not in native byte order"),
    ],
)
def test_unsupported_dtypes_raise_a_clear_error(array: np.ndarray, message: str) -> None:
    with pytest.raises(UnsupportedDtypeError, match=message):
        _one_rank(lambda comm: C.allreduce(array, comm=comm))
    with pytest.raises(UnsupportedDtypeError, match=message):
        _one_rank(lambda comm: C.allgather(array, comm=comm))


def test_non_arrays_are_refused_by_type() -> None:
    with pytest.raises(UnsupportedDtypeError, match=r"cannot communicate a builtins\.list"):
        _one_rank(lambda comm: C.allreduce([1, 2, 3], comm=comm))


def test_ops_and_algorithms_are_checked() -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(UnsupportedOpError, match="op 'bor' does not apply to float32"):
        _one_rank(lambda comm: C.allreduce(x, "bor", comm=comm))
    with pytest.raises(UnsupportedOpError, match="unknown op 'mean'; valid ops are"):
        _one_rank(lambda comm: C.allreduce(x, "mean", comm=comm))
    with pytest.raises(
        UnknownAlgorithmError,
        match="unknown algorithm 'rign' for allreduce; valid algorithms are auto, ring",
    ):
        _one_rank(lambda comm: C.allreduce(x, algorithm="rign", comm=comm))


@pytest.mark.parametrize(
    ("out", "message"),
    [
        (np.empty(5, np.float32), r"out has shape \(5,\), expected \(4,\)"),
        (np.empty(4, np.float64), "out has dtype float64, expected float32"),
        (np.empty((2, 2), np.float32), r"out has shape \(2, 2\)"),
        ([0, 0, 0, 0], "out is a list, but the input is a ndarray"),
    ],
)
def test_a_wrong_out_is_named(out: Any, message: str) -> None:
    x = np.ones(4, np.float32)
    with pytest.raises(InvalidBufferError, match=message):
        _one_rank(lambda comm: C.allreduce(x, out=out, comm=comm))


def test_a_read_only_out_is_refused() -> None:
    out = np.empty(4, np.float32)
    out.flags.writeable = False
    with pytest.raises(InvalidBufferError, match="out is read-only"):
        _one_rank(lambda comm: C.allreduce(np.ones(4, np.float32), out=out, comm=comm))


def test_reduce_scatter_and_allgather_check_their_sizes(ranks: Ranks) -> None:
    def indivisible(comm: Communicator) -> None:
        with pytest.raises(
            InvalidBufferError,
            match=r"first dimension of x \(shape \(5,\)\) to be divisible by the world size 2",
        ):
            C.reduce_scatter(np.ones(5, np.float32), comm=comm)
        with pytest.raises(InvalidBufferError, match=r"counts \(2, 2\) add up to 4, not 5"):
            C.reduce_scatter(np.ones(5, np.float32), counts=(2, 2), comm=comm)
        with pytest.raises(InvalidBufferError, match="counts must give 2 non-negative element counts"):
            C.reduce_scatter(np.ones(5, np.float32), counts=(6, -1), comm=comm)
        with pytest.raises(InvalidBufferError, match=r"x has 3 elements but counts\[\d\] is 1"):
            C.allgather(np.ones(3, np.float32), counts=(1, 1), comm=comm)
        with pytest.raises(InvalidBufferError, match=r"out has shape \(3,\), expected \(2,\)"):
            C.reduce_scatter(np.ones(4, np.float32), out=np.empty(3, np.float32), comm=comm)

    ranks(2, indivisible)


def test_a_rank_that_fails_does_not_hang_the_others(ranks: Ranks) -> None:
    def run(comm: Communicator) -> Any:
        if comm.rank == 1:
            raise RuntimeError("rank 1 gave up")
        return C.allreduce(np.ones(8), comm=comm)

    with pytest.raises(RuntimeError, match="rank 1 gave up"):
        ranks(3, run)


@settings(max_examples=40, deadline=None)
@given(shares(max_world=6, max_share=9), st.sampled_from(["sum", "max", "bxor"]))
def test_unequal_shares_on_loopback_match_numpy(counts: tuple[int, ...], op: str) -> None:
    world_size, total = len(counts), sum(counts)
    inputs = [np.random.default_rng(r).integers(0, 50, total).astype(np.int64) for r in range(world_size)]
    reduce = {"sum": np.add, "max": np.maximum, "bxor": np.bitwise_xor}[op].reduce
    expected = reduce(np.stack(inputs), axis=0) if total else np.zeros(0, np.int64)
    starts = np.cumsum((0, *counts))

    def run(comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        x = inputs[comm.rank]
        mine = C.reduce_scatter(x, op, counts=counts, comm=comm)
        gathered = C.allgather(mine, counts=counts, comm=comm)
        return mine, gathered

    for rank, (mine, gathered) in enumerate(run_ranks(world_size, run)):
        assert np.array_equal(mine, expected[starts[rank] : starts[rank + 1]])
        assert np.array_equal(gathered, expected)


def test_a_node_layout_gives_the_features_a_communicator_finds() -> None:
    from collectives.selector import layout_features

    assert layout_features(4, 4) == layout_features(4, 8) == {"shared_memory"}
    assert layout_features(8, 4) == {"shared_memory_nodes", "ranks_per_node=4"}
    assert layout_features(8, 1) == layout_features(8, 3) == frozenset()  # one a node, or unequal nodes
    for bad in (0, -2, 2.5, True):
        with pytest.raises(ValueError, match="ranks_per_node"):
            layout_features(8, bad)  # type: ignore[arg-type]


def test_explain_without_a_communicator_weighs_the_node_layout_it_is_told() -> None:
    import collectives

    bare = collectives.explain("allreduce", 1024, world_size=4)
    assert "shared_memory" in {r.algorithm for r in bare.rejected}
    one_node = collectives.explain("allreduce", 1024, world_size=4, ranks_per_node=4)
    assert "shared_memory" in {c.algorithm for c in one_node.candidates}
    nodes = collectives.explain("allreduce", 1 << 24, world_size=16, ranks_per_node=8)
    assert "hierarchical_shared_memory" in {c.algorithm for c in nodes.candidates}
    assert "shared_memory" not in {c.algorithm for c in nodes.candidates}
