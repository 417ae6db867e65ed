"""allreduce under mpiexec: every dtype and op, in and out of place, bitwise against comm.Allreduce."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import (
    DTYPE_OPS,
    Problems,
    algorithms_for,
    closed_form,
    counts_for,
    exact_input,
    mpi_reference,
)

pytestmark = pytest.mark.mpi


def _check_forms(
    problems: Problems, x: np.ndarray, op: str, expected: np.ndarray, label: str, **options: str
) -> None:
    """Run allreduce fresh, with ``out=`` and in place, and compare each with ``expected``."""
    original = x.copy()
    with problems.guard(f"{label} fresh"):
        problems.expect_equal(f"{label} fresh", collectives.allreduce(x, op, **options), expected)
        problems.expect_equal(f"{label} fresh changed its input", x, original)
    with problems.guard(f"{label} out="):
        out = np.zeros_like(x)
        result = collectives.allreduce(x, op, out=out, **options)
        problems.expect(result is out, f"{label} out=: returned something other than out")
        problems.expect_equal(f"{label} out=", out, expected)
        problems.expect_equal(f"{label} out= changed its input", x, original)
    with problems.guard(f"{label} in place"):
        result = collectives.allreduce(x, op, out=x, **options)
        problems.expect(result is x, f"{label} in place: returned something other than x")
        problems.expect_equal(f"{label} in place", x, expected)


# References: comm.Allreduce for every dtype MPI reduces (with MPICH, all but bfloat16); for
# bfloat16, comm.Allreduce in float32 cast back. The closed form of the exact pattern is checked
# against that reference too, so bfloat16 is held to both.
@pytest.mark.parametrize(("dtype", "op"), DTYPE_OPS)
def test_allreduce_matches_mpi(dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for count in counts_for(world.size):
        x = exact_input(op, dtype, count, world.rank, world.size)
        expected = mpi_reference("allreduce", x, op, world)
        label = f"count={count}"
        problems.expect_equal(
            f"{label} reference vs closed form", expected, closed_form(op, dtype, count, world.size)
        )
        _check_forms(problems, x, op, expected, label)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
@pytest.mark.parametrize(
    ("dtype", "op"),
    [("float32", "sum"), ("float64", "prod"), ("bfloat16", "avg"), ("int8", "max"), ("uint64", "bxor")],
)
def test_allreduce_every_algorithm(algorithm: str, dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    for count in counts_for(world.size):
        x = exact_input(op, dtype, count, world.rank, world.size)
        expected = mpi_reference("allreduce", x, op, world)
        _check_forms(problems, x, op, expected, f"count={count}", algorithm=algorithm)
    problems.check()


@pytest.mark.parametrize("shape", [(), (0, 3), (1, 1), (5, 3), (2, 3, 5)])
def test_allreduce_keeps_shape(shape: tuple[int, ...], world: MPI.Intracomm) -> None:
    count = int(np.prod(shape, dtype=np.int64))
    x = exact_input("sum", "int32", count, world.rank, world.size).reshape(shape)
    expected = mpi_reference("allreduce", x, "sum", world)
    problems = Problems(world)
    _check_forms(problems, x, "sum", expected, f"shape={shape}")
    problems.check()


def test_allreduce_strided_input(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    count = 2 * world.size + 1
    rank, size = world.rank, world.size
    line = exact_input("sum", "float32", 2 * count, rank, size)
    grid = exact_input("max", "int16", 6 * count, rank, size).reshape(count, 6)
    for label, x, op in [
        ("every other element", line.copy()[::2], "sum"),
        ("reversed", line.copy()[::-1], "sum"),
        ("transposed", grid.copy().T, "max"),
        ("a column", grid.copy()[:, 2], "max"),
    ]:
        problems.expect(not x.flags.c_contiguous, f"{label}: the view is contiguous")
        expected = mpi_reference("allreduce", x, op, world)
        # in place must write through the view into its base
        _check_forms(problems, x, op, expected, label)
    problems.check()


def test_allreduce_strided_out(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    x = exact_input("min", "uint32", 7, world.rank, world.size)
    expected = mpi_reference("allreduce", x, "min", world)
    holder = np.full(14, 99, np.uint32)
    with problems.guard("out= strided"):
        result = collectives.allreduce(x, "min", out=holder[::2])
        problems.expect_equal("out= strided", result, expected)
        problems.expect_equal("the strided out's base", holder[::2], expected)
        problems.expect_equal("the gaps of the strided out", holder[1::2], np.full(7, 99, np.uint32))
    problems.check()
