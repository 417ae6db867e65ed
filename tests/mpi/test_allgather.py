"""allgather under mpiexec: equal and unequal contributions, bitwise against comm.Allgather(v)."""

from collections.abc import Sequence

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.ops import DTYPES
from tests.mpi.helpers import Problems, algorithms_for, gather_input, uneven_counts

pytestmark = pytest.mark.mpi


def _bits(x: np.ndarray) -> np.ndarray:
    """A contiguous unsigned view of ``x``, which MPI moves whatever the dtype (bfloat16 too)."""
    return x.copy(order="C").view(f"u{x.dtype.itemsize}")


def _mpi_allgather(x: np.ndarray, world: MPI.Intracomm, counts: Sequence[int] | None) -> np.ndarray:
    """The reference: comm.Allgather stacking along the first axis, or comm.Allgatherv flat."""
    send = _bits(x)
    if counts is None:
        received = np.empty((world.size * send.size,), send.dtype)
        world.Allgather(send, received)
        received = received.reshape((world.size * (x.shape[0] if x.ndim else 1), *x.shape[1:]))
    else:
        received = np.empty(sum(counts), send.dtype)
        world.Allgatherv(send.reshape(-1), [received, list(counts)])
    return received.view(x.dtype)


def _check_forms(
    problems: Problems,
    x: np.ndarray,
    expected: np.ndarray,
    label: str,
    counts: Sequence[int] | None = None,
    **options: str,
) -> None:
    """Run allgather returning a fresh result and with ``out=``; compare each with ``expected``."""
    original = x.copy()
    with problems.guard(f"{label} fresh"):
        result = collectives.allgather(x, counts=counts, **options)
        problems.expect_equal(f"{label} fresh", result, expected)
        problems.expect_equal(f"{label} fresh changed its input", x, original)
    with problems.guard(f"{label} out="):
        out = np.zeros_like(expected)
        result = collectives.allgather(x, counts=counts, out=out, **options)
        problems.expect(result is out, f"{label} out=: returned something other than out")
        problems.expect_equal(f"{label} out=", out, expected)
        problems.expect_equal(f"{label} out= changed its input", x, original)


def _shapes(world_size: int) -> list[tuple[int, ...]]:
    """Shapes every rank contributes: 0-d, empty, fewer than P, P + 1, a few thousand, 2-D."""
    p = world_size
    return [(), (0,), (1,), (max(p - 1, 1),), (p + 1,), (3001,), (0, 3), (2, 3), (p + 1, 3)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_allgather_matches_mpi(dtype: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for shape in _shapes(world.size):
        x = gather_input(dtype, shape, world.rank)
        _check_forms(problems, x, _mpi_allgather(x, world, None), f"shape={shape}")
    for counts in uneven_counts(world.size):
        x = gather_input(dtype, (counts[world.rank],), world.rank)
        _check_forms(problems, x, _mpi_allgather(x, world, counts), f"counts={counts}", counts)
    problems.check()


def test_allgather_0d_gives_one_element_per_rank(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("0-d"):
        result = collectives.allgather(np.array(world.rank + 0.5))
        problems.expect_equal("0-d", result, np.arange(world.size) + 0.5)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("allgather"))
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "int8", "uint64"])
def test_allgather_every_algorithm(algorithm: str, dtype: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for shape in _shapes(world.size):
        x = gather_input(dtype, shape, world.rank)
        expected = _mpi_allgather(x, world, None)
        _check_forms(problems, x, expected, f"shape={shape}", algorithm=algorithm)
    for counts in uneven_counts(world.size):
        x = gather_input(dtype, (counts[world.rank],), world.rank)
        expected = _mpi_allgather(x, world, counts)
        _check_forms(problems, x, expected, f"counts={counts}", counts, algorithm=algorithm)
    problems.check()


def test_allgather_strided(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    line = gather_input("int32", (10,), world.rank)
    grid = gather_input("float64", (3, 4), world.rank)
    for label, x in [("every other element", line[::2]), ("transposed", grid.T)]:
        _check_forms(problems, x, _mpi_allgather(x, world, None), label)
    x = line[::2]
    expected = _mpi_allgather(x, world, None)
    holder = np.full(2 * expected.size, -1, np.int32)
    with problems.guard("out= strided"):
        result = collectives.allgather(x, out=holder[::2])
        problems.expect_equal("out= strided", result, expected)
        problems.expect_equal("the gaps of the strided out", holder[1::2], np.full_like(expected, -1))
    problems.check()
