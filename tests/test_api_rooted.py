"""The rooted collectives, alltoall and barrier on loopback ranks: results, roots, forms, errors."""

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import collectives as C
from collectives import Communicator, InvalidBufferError, InvalidRootError, UnknownAlgorithmError
from collectives.algorithms import ALGORITHMS
from collectives.specs import exact_pattern

from .conftest import run_ranks

Ranks = Callable[..., list[Any]]
WORLD_SIZES = [1, 2, 3, 5]
FLOATS = [np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.float64)]


def _algorithms(collective: str) -> list[str]:
    return [name for name, module in ALGORITHMS.items() if hasattr(module, collective)]


def _cases(collective: str) -> list[tuple[int, int, str]]:
    """(world size, root, algorithm): roots 0 and P - 1 with every algorithm of the collective."""
    return [
        (size, root, algorithm)
        for size in WORLD_SIZES
        for root in sorted({0, size - 1})
        for algorithm in _algorithms(collective)
    ]


def _counts(world_size: int) -> list[int]:
    """0, 1, fewer than P, P + 1, and not divisible by P."""
    return sorted({0, 1, max(world_size - 1, 0), world_size + 1, 3 * world_size + 2})


def _input(rank: int, count: int, dtype: Any = np.int32) -> np.ndarray:
    """Values that name the rank and the element."""
    return (np.arange(count) * 7 + 1000 * rank).astype(dtype)


def _random(rank: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    return np.random.default_rng(100 + rank).standard_normal(shape).astype(dtype)


def _same_bits(a: Any, b: np.ndarray) -> bool:
    return (
        isinstance(a, np.ndarray) and a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
    )


@pytest.mark.parametrize(("world_size", "root", "algorithm"), _cases("broadcast"))
def test_broadcast_fresh_out_and_in_place(ranks: Ranks, world_size: int, root: int, algorithm: str) -> None:
    for count in _counts(world_size):
        inputs = [_input(r, count) for r in range(world_size)]

        def run(comm: Communicator, xs: list[np.ndarray] = inputs) -> tuple[np.ndarray, ...]:
            x = xs[comm.rank].copy()
            original = x.copy()
            fresh = C.broadcast(x, root, algorithm=algorithm, comm=comm)
            out = np.full_like(x, -1)
            assert C.broadcast(x, root, out=out, algorithm=algorithm, comm=comm) is out
            assert _same_bits(x, original)  # out of place leaves x alone
            assert C.broadcast(x, root, out=x, algorithm=algorithm, comm=comm) is x
            return fresh, out, x

        for rank, results in enumerate(ranks(world_size, run)):
            assert all(_same_bits(r, inputs[root]) for r in results), (world_size, count, rank)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_broadcast_keeps_shape_and_bits_of_random_floats(ranks: Ranks, dtype: np.dtype) -> None:
    inputs = [_random(r, (4, 3, 2), dtype) for r in range(5)]
    strided = ranks(5, lambda comm: C.broadcast(inputs[comm.rank][:, ::2], 3, comm=comm))
    fresh = ranks(5, lambda comm: C.broadcast(inputs[comm.rank], 3, comm=comm))
    assert all(_same_bits(r, inputs[3]) for r in fresh)
    assert all(_same_bits(r, np.ascontiguousarray(inputs[3][:, ::2])) for r in strided)


@pytest.mark.parametrize(("world_size", "root", "algorithm"), _cases("reduce"))
def test_reduce_gives_the_root_the_result(ranks: Ranks, world_size: int, root: int, algorithm: str) -> None:
    pattern = exact_pattern("sum", world_size)
    for count in _counts(world_size):
        index = np.arange(count)
        inputs = [np.take(pattern.values, (index + r) % 5).astype(np.int32) for r in range(world_size)]
        expected = np.take(pattern.combined, index % 5).astype(np.int32)

        def run(comm: Communicator, xs: list[np.ndarray] = inputs) -> tuple[Any, ...]:
            x = xs[comm.rank].copy()
            original = x.copy()
            fresh = C.reduce(x, root=root, algorithm=algorithm, comm=comm)
            out = np.full_like(x, -1)
            given = C.reduce(x, "sum", root, out=out, algorithm=algorithm, comm=comm)
            assert _same_bits(x, original)
            in_place = C.reduce(x, root=root, out=x, algorithm=algorithm, comm=comm)
            return fresh, given, out, in_place, x, original

        for rank, (fresh, given, out, in_place, x, original) in enumerate(ranks(world_size, run)):
            if rank == root:
                assert given is out and in_place is x
                assert all(_same_bits(r, expected) for r in (fresh, out, x)), (world_size, count)
            else:
                assert fresh is given is in_place is None
                assert (out == -1).all()  # written only at the root
                assert _same_bits(x, original)


@pytest.mark.parametrize(("op", "dtype"), [("avg", "bfloat16"), ("prod", "float64"), ("bxor", "uint16")])
def test_reduce_every_kind_of_op(ranks: Ranks, op: str, dtype: str) -> None:
    numpy_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    pattern = exact_pattern(op, 3)
    index = np.arange(11)
    period = len(pattern.values)
    inputs = [np.take(pattern.values, (index + r) % period).astype(numpy_dtype) for r in range(3)]
    expected = np.take(pattern.combined, index % period).astype(numpy_dtype)
    if op == "avg":
        expected = expected / np.array(3, numpy_dtype)
    results = ranks(3, lambda comm: C.reduce(inputs[comm.rank], op, root=1, comm=comm))
    assert results[0] is None and results[2] is None
    assert _same_bits(results[1], expected)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_reduce_of_random_floats_is_deterministic(ranks: Ranks, dtype: np.dtype) -> None:
    inputs = [_random(r, (103,), dtype) for r in range(5)]
    first = ranks(5, lambda comm: C.reduce(inputs[comm.rank], root=0, comm=comm))[0]
    again = ranks(5, lambda comm: C.reduce(inputs[comm.rank], root=0, comm=comm))[0]
    # the direct allreduce reduces at rank 0 in the same order, then copies the result out
    everyone = ranks(5, lambda comm: C.allreduce(inputs[comm.rank], algorithm="direct", comm=comm))
    assert _same_bits(again, first)
    assert all(_same_bits(r, first) for r in everyone)
    assert np.allclose(first.astype(np.float64), sum(x.astype(np.float64) for x in inputs), atol=0.1)


@pytest.mark.parametrize(("world_size", "root", "algorithm"), _cases("gather"))
def test_gather_stacks_at_the_root(ranks: Ranks, world_size: int, root: int, algorithm: str) -> None:
    for shape in [(), (0,), (1,), (world_size + 1,), (2, 3), (0, 2)]:
        for dtype in (np.dtype(np.int8), FLOATS[1]):
            inputs = [_random(r, shape, dtype) for r in range(world_size)]
            expected = np.stack(inputs) if shape == () else np.concatenate(inputs)

            def run(
                comm: Communicator, xs: list[np.ndarray] = inputs, expected: np.ndarray = expected
            ) -> tuple[Any, ...]:
                x = xs[comm.rank]
                out = np.zeros_like(expected)
                given = C.gather(x, root, out=out, algorithm=algorithm, comm=comm)
                return C.gather(x, root, algorithm=algorithm, comm=comm), given, out

            for rank, (fresh, given, out) in enumerate(ranks(world_size, run)):
                if rank == root:
                    assert given is out
                    assert _same_bits(fresh, expected) and _same_bits(out, expected), (shape, dtype)
                else:
                    assert fresh is None and given is None and not out.any()


def test_gather_with_unequal_counts(ranks: Ranks) -> None:
    counts = (2, 0, 3, 1)
    contributions = [_input(r, c, np.int64) for r, c in enumerate(counts)]
    results = ranks(4, lambda comm: C.gather(contributions[comm.rank], root=2, counts=counts, comm=comm))
    assert results[:2] == [None, None] and results[3] is None
    assert _same_bits(results[2], np.concatenate(contributions))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gather_and_scatter_in_place_at_the_root(ranks: Ranks, world_size: int) -> None:
    # as MPI_IN_PLACE: the root's own share already sits in its slot of the whole
    root = world_size - 1
    contributions = [_input(r, 3).reshape(3, 1) for r in range(world_size)]
    whole = np.concatenate(contributions)

    def run(comm: Communicator) -> tuple[Any, Any]:
        mine = slice(3 * comm.rank, 3 * comm.rank + 3)
        gathered = np.zeros_like(whole)
        gathered[mine] = contributions[comm.rank]
        x = gathered[mine] if comm.rank == root else contributions[comm.rank]
        result = C.gather(x, root, out=gathered, comm=comm)
        full = whole.copy()
        share = C.scatter(full if comm.rank == root else None, root, out=full[mine], comm=comm)
        return result, share

    for rank, (result, share) in enumerate(ranks(world_size, run)):
        assert _same_bits(result, whole) if rank == root else result is None
        assert _same_bits(share, contributions[rank])


@pytest.mark.parametrize(("world_size", "root", "algorithm"), _cases("scatter"))
def test_scatter_gives_each_rank_its_rows(ranks: Ranks, world_size: int, root: int, algorithm: str) -> None:
    for rows, rest in [(0, ()), (1, ()), (3, ()), (2, (3,)), (1, (0,))]:
        full = _input(7, world_size * rows * int(np.prod(rest, dtype=int))).reshape(world_size * rows, *rest)
        share = (rows, *rest)

        def run(
            comm: Communicator, full: np.ndarray = full, share: tuple[int, ...] = share
        ) -> tuple[Any, ...]:
            at_root = comm.rank == root
            # the root passes the data; the others the full shape, or nothing and out=
            x = full.copy() if at_root else np.zeros_like(full)
            fresh = C.scatter(x, root, algorithm=algorithm, comm=comm)
            out = np.full(share, -1, full.dtype)
            given = C.scatter(x if at_root else None, root, out=out, algorithm=algorithm, comm=comm)
            assert _same_bits(x, full) or not at_root  # the root's x is left alone
            return fresh, given, out

        for rank, (fresh, given, out) in enumerate(ranks(world_size, run)):
            expected = full[rank * rows : (rank + 1) * rows]
            assert given is out
            assert _same_bits(fresh, expected) and _same_bits(out, expected), (world_size, rows, rest)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_scatter_with_unequal_counts_moves_random_floats_exactly(ranks: Ranks, dtype: np.dtype) -> None:
    counts = (3, 0, 5, 1, 2)
    full = _random(0, (sum(counts),), dtype)
    starts = np.cumsum((0, *counts))

    def run(comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        x = full if comm.rank == 4 else None
        out = np.empty(counts[comm.rank], dtype)
        C.scatter(x, 4, counts=counts, out=out, comm=comm)
        return C.scatter(full, 4, counts=counts, comm=comm), out

    for rank, results in enumerate(ranks(5, run)):
        assert all(_same_bits(r, full[starts[rank] : starts[rank + 1]]) for r in results)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", _algorithms("alltoall"))
def test_alltoall_exchanges_shares_like_mpi(ranks: Ranks, world_size: int, algorithm: str) -> None:
    for rows, rest in [(0, ()), (1, ()), (3, ()), (world_size + 1, (2,)), (2, (0,))]:
        shape = (world_size * rows, *rest)
        inputs = [_input(r, int(np.prod(shape, dtype=int))).reshape(shape) for r in range(world_size)]

        def run(comm: Communicator, xs: list[np.ndarray] = inputs) -> tuple[np.ndarray, ...]:
            x = xs[comm.rank].copy()
            original = x.copy()
            fresh = C.alltoall(x, algorithm=algorithm, comm=comm)
            out = np.full_like(x, -1)
            assert C.alltoall(x, out=out, algorithm=algorithm, comm=comm) is out
            assert _same_bits(x, original)
            assert C.alltoall(x, out=x, algorithm=algorithm, comm=comm) is x
            return fresh, out, x

        for rank, results in enumerate(ranks(world_size, run)):
            mine = [inputs[peer][rank * rows : (rank + 1) * rows] for peer in range(world_size)]
            expected = np.concatenate(mine)
            assert all(_same_bits(r, expected) for r in results), (world_size, rows, rest, rank)


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
def test_alltoall_twice_is_the_identity_on_random_floats(ranks: Ranks, dtype: np.dtype) -> None:
    inputs = [_random(r, (10, 3), dtype) for r in range(5)]
    results = ranks(5, lambda comm: C.alltoall(C.alltoall(inputs[comm.rank], comm=comm), comm=comm))
    assert all(_same_bits(r, inputs[rank]) for rank, r in enumerate(results))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("algorithm", _algorithms("barrier"))
def test_no_rank_leaves_the_barrier_before_every_rank_has_entered(
    ranks: Ranks, world_size: int, algorithm: str
) -> None:
    entered: list[int] = []
    lock = threading.Lock()
    delays = [random.Random(world_size * 10 + r).uniform(0, 0.02) for r in range(world_size)]

    def run(comm: Communicator) -> list[int]:
        seen = []
        for _ in range(3):
            time.sleep(delays[comm.rank])
            with lock:
                entered.append(comm.rank)
            C.barrier(comm, algorithm=algorithm)
            with lock:
                seen.append(len(entered))
            # a second barrier keeps the next round's entries out of this round's count
            C.barrier(comm, algorithm=algorithm)
        return seen

    # after the first barrier of round i every rank, and no more, has entered i + 1 times
    expected = [world_size * (i + 1) for i in range(3)]
    assert ranks(world_size, run) == [expected] * world_size


def _one_rank(call: Callable[[Communicator], Any]) -> Any:
    return run_ranks(1, call)[0]


@pytest.mark.parametrize("collective", ["broadcast", "reduce", "gather", "scatter"])
@pytest.mark.parametrize("root", [-1, 3, 7])
def test_a_root_outside_the_communicator_is_named(ranks: Ranks, collective: str, root: int) -> None:
    call = getattr(C, collective)

    def run(comm: Communicator) -> None:
        with pytest.raises(InvalidRootError, match=rf"root {root} is not a rank: valid roots are 0\.\.2"):
            call(np.zeros(6), root=root, comm=comm)

    ranks(3, run)
    with pytest.raises(InvalidRootError, match=r"root must be an integer rank, got '0'"):
        _one_rank(lambda comm: call(np.zeros(1), root="0", comm=comm))


def test_scatter_says_what_a_rank_lacks(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        if comm.rank == 0:
            with pytest.raises(InvalidBufferError, match="scatter needs x at the root, rank 0"):
                C.scatter(None, 0, out=np.empty(2), comm=comm)
        else:
            with pytest.raises(
                InvalidBufferError,
                match="scatter needs out= \\(or x\\) on rank 1, which is not the root 0, to know the shape",
            ):
                C.scatter(None, 0, comm=comm)
        with pytest.raises(InvalidBufferError, match=r"out has shape \(3,\), expected \(2,\)"):
            C.scatter(np.zeros(4), 0, out=np.empty(3), comm=comm)
        with pytest.raises(InvalidBufferError, match="scatter needs the first dimension of x"):
            C.scatter(np.zeros(5), 0, comm=comm)
        with pytest.raises(InvalidBufferError, match=rf"out has shape \(3,\), expected \({2 - comm.rank},\)"):
            C.scatter(None if comm.rank else np.zeros(3), 0, counts=(2, 1), out=np.empty(3), comm=comm)

    ranks(2, run)


def test_alltoall_gather_and_barrier_check_their_arguments(ranks: Ranks) -> None:
    def run(comm: Communicator) -> None:
        with pytest.raises(
            InvalidBufferError,
            match=r"alltoall needs the first dimension of x \(shape \(3, 2\)\) to be divisible by the "
            "world size 2",
        ):
            C.alltoall(np.zeros((3, 2)), comm=comm)
        with pytest.raises(InvalidBufferError, match="alltoall needs the first dimension of x"):
            C.alltoall(np.array(1.0), comm=comm)
        with pytest.raises(InvalidBufferError, match=r"out has shape \(2,\), expected \(4,\)"):
            C.gather(np.zeros(2), out=np.empty(2), comm=comm)
        with pytest.raises(InvalidBufferError, match=r"x has 3 elements but counts\[\d\] is 1"):
            C.gather(np.zeros(3), counts=(1, 1), comm=comm)
        with pytest.raises(UnknownAlgorithmError, match="valid algorithms are auto, direct, dissemination"):
            C.barrier(comm, algorithm="ring")

    ranks(2, run)
