"""reduce_scatter under mpiexec: equal and unequal shares, bitwise against MPI's reduce-scatters."""

from collections.abc import Sequence

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import (
    DTYPE_OPS,
    Problems,
    algorithms_for,
    closed_form,
    exact_input,
    mpi_reference,
    uneven_counts,
)

pytestmark = pytest.mark.mpi


def _equal_shapes(world_size: int) -> list[tuple[int, ...]]:
    """Input shapes of P * k rows: none, one per rank, a few, a few thousand; and 2-D ones."""
    p = world_size
    return [(0,), (p,), (3 * p,), (751 * p,), (0, 3), (p, 3), (2 * p, 3)]


def _check_forms(
    problems: Problems,
    x: np.ndarray,
    op: str,
    expected: np.ndarray,
    label: str,
    counts: Sequence[int] | None = None,
    **options: str,
) -> None:
    """Run reduce_scatter returning a fresh share and with ``out=``; compare each with ``expected``."""
    original = x.copy()
    with problems.guard(f"{label} fresh"):
        result = collectives.reduce_scatter(x, op, counts=counts, **options)
        problems.expect_equal(f"{label} fresh", result, expected)
        problems.expect_equal(f"{label} fresh changed its input", x, original)
    with problems.guard(f"{label} out="):
        out = np.zeros_like(expected)
        result = collectives.reduce_scatter(x, op, counts=counts, out=out, **options)
        problems.expect(result is out, f"{label} out=: returned something other than out")
        problems.expect_equal(f"{label} out=", out, expected)
        problems.expect_equal(f"{label} out= changed its input", x, original)


def _closed_form_share(
    op: str, x: np.ndarray, world: MPI.Intracomm, counts: Sequence[int] | None
) -> np.ndarray:
    """This rank's share of the exact pattern's closed-form result."""
    whole = closed_form(op, x.dtype.name, x.size, world.size).reshape(x.shape)
    if counts is None:
        rows = x.shape[0] // world.size
        return whole[world.rank * rows : (world.rank + 1) * rows]
    start = sum(counts[: world.rank])
    return whole.reshape(-1)[start : start + counts[world.rank]]


# References: comm.Reduce_scatter_block and comm.Reduce_scatter for every dtype MPI reduces (with
# MPICH, all but bfloat16); for bfloat16, the same in float32 cast back. All are also checked
# against the closed form of the exact pattern.
@pytest.mark.parametrize(("dtype", "op"), DTYPE_OPS)
def test_reduce_scatter_matches_mpi(dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    cases: list[tuple[tuple[int, ...], list[int] | None]] = [
        (shape, None) for shape in _equal_shapes(world.size)
    ]
    cases += [((sum(counts),), counts) for counts in uneven_counts(world.size)]
    for shape, counts in cases:
        x = exact_input(op, dtype, int(np.prod(shape)), world.rank, world.size).reshape(shape)
        expected = mpi_reference("reduce_scatter", x, op, world, counts)
        label = f"shape={shape} counts={counts}"
        problems.expect_equal(
            f"{label} reference vs closed form", expected, _closed_form_share(op, x, world, counts)
        )
        _check_forms(problems, x, op, expected, label, counts)
    problems.check()


def test_reduce_scatter_counts_take_2d_input_flat(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    counts = [2 * r + 1 for r in range(world.size)]
    total = sum(counts)
    # a total of P**2 elements laid out as P rows: counts cut across the rows
    x = exact_input("sum", "float64", total, world.rank, world.size).reshape(world.size, -1)
    expected = mpi_reference("reduce_scatter", x, "sum", world, counts)
    _check_forms(problems, x, "sum", expected, f"counts={counts}", counts)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("reduce_scatter"))
@pytest.mark.parametrize(
    ("dtype", "op"), [("float32", "sum"), ("bfloat16", "avg"), ("int8", "min"), ("uint16", "bor")]
)
def test_reduce_scatter_every_algorithm(algorithm: str, dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    cases: list[tuple[int, list[int] | None]] = [(3 * world.size, None), (751 * world.size, None)]
    cases += [(sum(counts), counts) for counts in uneven_counts(world.size)]
    for total, counts in cases:
        x = exact_input(op, dtype, total, world.rank, world.size)
        expected = mpi_reference("reduce_scatter", x, op, world, counts)
        label = f"count={total} counts={counts}"
        _check_forms(problems, x, op, expected, label, counts, algorithm=algorithm)
    problems.check()


def test_reduce_scatter_strided_input(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    p = world.size
    line = exact_input("sum", "int64", 6 * p, world.rank, world.size)
    grid = exact_input("max", "float32", 2 * p * 4, world.rank, world.size).reshape(4, 2 * p)
    counts = [r % 3 for r in range(p)]
    for label, x, op, share_counts in [
        ("every other element", line[::2], "sum", None),
        ("every other element with counts", line[: 2 * sum(counts) : 2], "sum", counts),
        ("transposed", grid.T, "max", None),
    ]:
        expected = mpi_reference("reduce_scatter", x, op, world, share_counts)
        _check_forms(problems, x, op, expected, label, share_counts)
    problems.check()
