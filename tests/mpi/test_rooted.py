"""broadcast, reduce, gather, scatter, alltoall and barrier under mpiexec, bitwise against mpi4py's own."""

import time
from collections.abc import Sequence

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.ops import DTYPES
from tests.mpi.helpers import (
    DTYPE_OPS,
    Problems,
    algorithms_for,
    closed_form,
    counts_for,
    exact_input,
    gather_input,
    mpi_reference,
    uneven_counts,
)

pytestmark = pytest.mark.mpi

MOVED_DTYPES = ["float16", "bfloat16", "float64", "int8", "uint64"]
"""Dtypes for the collectives that only move data: every width, and bfloat16, which MPI lacks."""


def _roots(world: MPI.Intracomm) -> list[int]:
    return sorted({0, world.size - 1})


def _bits(x: np.ndarray) -> np.ndarray:
    """A contiguous unsigned view of ``x``, which MPI moves whatever the dtype (bfloat16 too)."""
    return x.copy(order="C").view(f"u{x.dtype.itemsize}")


def _shapes(world_size: int) -> list[tuple[int, ...]]:
    """Per-rank shapes: 0-d, empty, one element, P + 1, a few thousand, 2-D."""
    p = world_size
    return [(), (0,), (1,), (p + 1,), (3001,), (0, 3), (p + 1, 3)]


@pytest.mark.parametrize("algorithm", algorithms_for("broadcast"))
@pytest.mark.parametrize("dtype", MOVED_DTYPES)
def test_broadcast_matches_mpi(dtype: str, algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for root in _roots(world):
        for shape in _shapes(world.size):
            label = f"root={root} shape={shape}"
            x = gather_input(dtype, shape, world.rank)
            reference = _bits(x)
            world.Bcast(reference, root=root)
            expected = reference.view(x.dtype).reshape(shape)
            original = x.copy()
            with problems.guard(label):
                fresh = collectives.broadcast(x, root, algorithm=algorithm)
                problems.expect_equal(f"{label} fresh", fresh, expected)
                problems.expect_equal(f"{label} fresh changed x", x, original)
                out = np.zeros_like(x)
                problems.expect(collectives.broadcast(x, root, out=out, algorithm=algorithm) is out, label)
                problems.expect_equal(f"{label} out=", out, expected)
                collectives.broadcast(x, root, out=x, algorithm=algorithm)
                problems.expect_equal(f"{label} in place", x, expected)
    problems.check()


@pytest.mark.parametrize(("dtype", "op"), DTYPE_OPS)
def test_reduce_matches_mpi(dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for root in _roots(world):
        for count in counts_for(world.size):
            label = f"root={root} count={count}"
            x = exact_input(op, dtype, count, world.rank, world.size)
            expected = mpi_reference("reduce", x, op, world, root=root)
            at_root = world.rank == root
            if at_root:
                closed = closed_form(op, dtype, count, world.size)
                problems.expect_equal(f"{label} reference vs closed form", expected, closed)
            with problems.guard(label):
                result = collectives.reduce(x, op, root)
                out = np.zeros_like(x)
                given = collectives.reduce(x, op, root, out=out)
                if at_root:
                    problems.expect_equal(f"{label} fresh", result, expected)
                    problems.expect(given is out, f"{label} out=: returned something other than out")
                    problems.expect_equal(f"{label} out=", out, expected)
                else:
                    problems.expect(result is None and given is None, f"{label}: a result off the root")
                    problems.expect(not out.any(), f"{label}: out written off the root")
                collectives.reduce(x, op, root, out=x)
                if at_root:
                    problems.expect_equal(f"{label} in place", x, expected)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("reduce"))
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_reduce_of_random_floats_is_the_same_every_time(
    dtype: str, algorithm: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    x = np.random.default_rng(30_000 + world.rank).normal(size=1003).astype(dtype)
    root = world.size - 1
    with problems.guard("reduce"):
        first = collectives.reduce(x, root=root, algorithm=algorithm)
        again = collectives.reduce(x, root=root, algorithm=algorithm)
        if world.rank == root:
            problems.expect_equal("repeated", again, first)
    problems.check()


def _mpi_gather(x: np.ndarray, root: int, world: MPI.Intracomm, counts: Sequence[int] | None) -> np.ndarray:
    """comm.Gather stacking along the first axis, or comm.Gatherv flat; significant at the root."""
    send = _bits(x)
    if counts is None:
        received = np.zeros(world.size * send.size, send.dtype)
        world.Gather(send, received, root=root)
        return received.view(x.dtype).reshape((world.size * (x.shape[0] if x.ndim else 1), *x.shape[1:]))
    received = np.zeros(sum(counts), send.dtype)
    world.Gatherv(send.reshape(-1), [received, list(counts)], root=root)
    return received.view(x.dtype)


@pytest.mark.parametrize("algorithm", algorithms_for("gather"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_gather_matches_mpi(dtype: str, algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    cases: list[tuple[np.ndarray, list[int] | None]] = [
        (gather_input(dtype, shape, world.rank), None) for shape in _shapes(world.size)
    ]
    cases += [(gather_input(dtype, (c[world.rank],), world.rank), c) for c in uneven_counts(world.size)]
    for root in _roots(world):
        for x, counts in cases:
            label = f"root={root} shape={x.shape} counts={counts}"
            expected = _mpi_gather(x, root, world, counts)
            with problems.guard(label):
                result = collectives.gather(x, root, counts=counts, algorithm=algorithm)
                out = np.zeros_like(expected)
                given = collectives.gather(x, root, counts=counts, out=out, algorithm=algorithm)
                if world.rank == root:
                    problems.expect_equal(f"{label} fresh", result, expected)
                    problems.expect(given is out, f"{label} out=: returned something other than out")
                    problems.expect_equal(f"{label} out=", out, expected)
                else:
                    problems.expect(result is None and given is None, f"{label}: a result off the root")
    problems.check()


def _mpi_scatter(
    full: np.ndarray, root: int, world: MPI.Intracomm, counts: Sequence[int] | None
) -> np.ndarray:
    """This rank's share by comm.Scatter (rows) or comm.Scatterv (flat)."""
    send = _bits(full)
    if counts is None:
        share = (full.shape[0] // world.size, *full.shape[1:])
        received = np.zeros(share, send.dtype)
        world.Scatter(send if world.rank == root else None, received, root=root)
        return received.view(full.dtype)
    received = np.zeros(counts[world.rank], send.dtype)
    world.Scatterv([send.reshape(-1), list(counts)] if world.rank == root else None, received, root=root)
    return received.view(full.dtype)


@pytest.mark.parametrize("algorithm", algorithms_for("scatter"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_scatter_matches_mpi(dtype: str, algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    p = world.size
    for root in _roots(world):
        # the root's data differs from every other rank's, so a share from the wrong rank shows
        shapes: list[tuple[tuple[int, ...], list[int] | None]] = [
            ((0,), None), ((p,), None), ((3 * p,), None), ((1001 * p,), None), ((2 * p, 3), None)
        ]  # fmt: skip
        shapes += [((sum(c),), c) for c in uneven_counts(p)]
        for shape, counts in shapes:
            label = f"root={root} shape={shape} counts={counts}"
            full = gather_input(dtype, shape, world.rank)
            expected = _mpi_scatter(full, root, world, counts)
            with problems.guard(label):
                result = collectives.scatter(full, root, counts=counts, algorithm=algorithm)
                problems.expect_equal(f"{label} fresh", result, expected)
                out = np.zeros_like(expected)
                x = full if world.rank == root else None
                given = collectives.scatter(x, root, counts=counts, out=out, algorithm=algorithm)
                problems.expect(given is out, f"{label} out=: returned something other than out")
                problems.expect_equal(f"{label} out= (x=None off the root)", out, expected)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("alltoall"))
@pytest.mark.parametrize("dtype", DTYPES)
def test_alltoall_matches_mpi(dtype: str, algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    p = world.size
    for shape in [(0,), (p,), (3 * p,), (1001 * p,), (0, 3), (2 * p, 3)]:
        label = f"shape={shape}"
        x = gather_input(dtype, shape, world.rank)
        received = np.zeros_like(_bits(x))
        world.Alltoall(_bits(x), received)
        expected = received.view(x.dtype).reshape(shape)
        original = x.copy()
        with problems.guard(label):
            problems.expect_equal(f"{label} fresh", collectives.alltoall(x, algorithm=algorithm), expected)
            problems.expect_equal(f"{label} fresh changed x", x, original)
            out = np.zeros_like(x)
            problems.expect(collectives.alltoall(x, out=out, algorithm=algorithm) is out, label)
            problems.expect_equal(f"{label} out=", out, expected)
            collectives.alltoall(x, out=x, algorithm=algorithm)
            problems.expect_equal(f"{label} in place", x, expected)
    problems.check()


LATE_S = 0.2
"""How long the last rank dawdles before entering the barrier."""


@pytest.mark.parametrize("algorithm", algorithms_for("barrier"))
def test_barrier_waits_for_the_last_rank_like_mpi(algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    late = world.size - 1
    for name, barrier in [
        ("MPI Barrier", world.Barrier),
        (algorithm, lambda: collectives.barrier(algorithm=algorithm)),
    ]:
        world.Barrier()
        start = time.perf_counter()
        if world.rank == late:
            time.sleep(LATE_S)
        with problems.guard(name):
            barrier()
        waited = time.perf_counter() - start
        # every rank leaves after the late one arrives; half the delay allows for the start's skew
        problems.expect(waited > LATE_S / 2, f"{name}: left after {waited:.3f} s, before rank {late} arrived")
    problems.check()
