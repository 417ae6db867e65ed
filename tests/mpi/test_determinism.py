"""Rounding under mpiexec: random floats give the same bits on every rank and on every run."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import Problems, algorithms_for
from tests.test_special_bits import special_inputs

pytestmark = pytest.mark.mpi

COUNT = 1003  # not divisible by 2, 3 or 4, so the chunks differ in size


def _random_input(dtype: str, rank: int, count: int = COUNT) -> np.ndarray:
    """Rank ``rank``'s random input, seeded by its rank: values whose sums round."""
    rng = np.random.default_rng(20_000 + rank)
    return rng.normal(size=count).astype(dtype)


def _rank0_bits(result: np.ndarray, world: MPI.Intracomm) -> np.ndarray:
    """Rank 0's result, as every rank sees it."""
    return np.frombuffer(world.bcast(result.tobytes(), root=0), result.dtype).reshape(result.shape)


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
@pytest.mark.parametrize("op", ["sum", "prod", "min", "max", "avg"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_allreduce_same_bits_everywhere_and_every_time(
    dtype: str, op: str, algorithm: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    x = _random_input(dtype, world.rank)
    with problems.guard("allreduce"):
        first = collectives.allreduce(x, op, algorithm=algorithm)
        problems.expect_equal("against rank 0", first, _rank0_bits(first, world))
        again = collectives.allreduce(x, op, algorithm=algorithm)
        problems.expect_equal("repeated", again, first)
        in_place = x.copy()
        collectives.allreduce(in_place, op, out=in_place, algorithm=algorithm)
        problems.expect_equal("in place", in_place, first)
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("reduce_scatter"))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reduce_scatter_same_bits_every_time(dtype: str, algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    x = _random_input(dtype, world.rank, 251 * world.size)
    counts = [r % 3 * 100 for r in range(world.size)]
    with problems.guard("reduce_scatter"):
        first = collectives.reduce_scatter(x, algorithm=algorithm)
        again = collectives.reduce_scatter(x, algorithm=algorithm)
        problems.expect_equal("repeated", again, first)
        first = collectives.reduce_scatter(x[: sum(counts)], counts=counts, algorithm=algorithm)
        again = collectives.reduce_scatter(x[: sum(counts)], counts=counts, algorithm=algorithm)
        problems.expect_equal("repeated with counts", again, first)
    problems.check()


def test_nan_and_inf_give_the_same_bits_everywhere(world: MPI.Intracomm) -> None:
    # a NaN on rank 0, and opposite infinities on the first and last ranks (a NaN when they meet)
    problems = Problems(world)
    x = np.arange(8, dtype=np.float32) + world.rank
    if world.rank == 0:
        x[1] = np.nan
        x[2] = np.inf
    if world.rank == world.size - 1 and world.size > 1:
        x[2] = -np.inf
    for op in ("sum", "max", "min"):
        with problems.guard(op):
            result = collectives.allreduce(x, op)
            problems.expect_equal(op, result, _rank0_bits(result, world))
            problems.expect(bool(np.isnan(result[1])), f"{op}: NaN did not propagate: {result[1]}")
    problems.check()


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_signed_zeros_and_nan_payloads_give_the_same_bits_on_every_rank(
    dtype: str, algorithm: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    for count in (1, 7, 301):
        x = special_inputs(dtype, world.size, count)[world.rank]
        for op in ("sum", "prod", "max", "min"):
            with problems.guard(f"{op}, count {count}"):
                result = collectives.allreduce(x, op, algorithm=algorithm)
                problems.expect_equal(
                    f"{op}, count {count}, against rank 0", result, _rank0_bits(result, world)
                )
    problems.check()
