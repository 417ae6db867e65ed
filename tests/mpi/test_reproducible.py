"""Reproducible sums under mpiexec: the exact model's bits at every world size, with every algorithm."""

import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import Problems, algorithms_for
from tests.reproducible_cases import DTYPES, contributions, model, spread

pytestmark = pytest.mark.mpi

COUNT = 1000


@pytest.mark.parametrize("dtype", DTYPES)
def test_allreduce_gives_the_models_bits_with_every_algorithm(dtype: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    parts = contributions(dtype, world.size, COUNT, seed=100 + world.size)  # every rank makes all of them
    expected = model(parts, dtype)
    for algorithm in ["auto", *algorithms_for("allreduce")]:
        with problems.guard(algorithm):
            result = collectives.allreduce(parts[world.rank], reproducible=True, algorithm=algorithm)
            problems.expect_equal(algorithm, result, expected)
    problems.check()


@pytest.mark.parametrize("dtype", DTYPES)
def test_twelve_contributions_dealt_to_the_ranks_give_one_processes_bits(
    dtype: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    parts = contributions(dtype, 12, COUNT, seed=12)
    alone = collectives.ReproducibleSum(like=parts[0])
    for part in parts:
        alone.add(part)
    for deal in ([list(range(world.rank, 12, world.size))], [spread(12, world.size, seed=5)[world.rank]]):
        with problems.guard("accumulator"):
            total = collectives.ReproducibleSum(like=parts[0])
            for index in deal[0]:
                total.add(parts[index])
            problems.expect_equal(f"dealt {deal[0]}", total.allreduce(), alone.value())
            counts = [COUNT // world.size + (r < COUNT % world.size) for r in range(world.size)]
            lo = sum(counts[: world.rank])
            share = total.reduce_scatter(counts=counts)
            problems.expect_equal("share", share, alone.value()[lo : lo + counts[world.rank]])
    problems.check()
