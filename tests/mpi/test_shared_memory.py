"""The shared-memory executor under mpiexec: allreduce, reduce_scatter and allgather against mpi4py."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

# past one segment of the window's halves, and past the one-barrier path of small allreduces
COUNTS = [0, 1, 5, 4097, 300_007, 1_100_003]


def test_shared_memory_runs_through_the_window(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    problems.expect("shared_memory" in comm.features, f"features {set(comm.features)}")
    problems.expect(comm._shared is not None, "no shared executor")
    comm.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_shared_memory_matches_mpi(world: MPI.Intracomm, dtype: str) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    for count in COUNTS:
        x = exact_input("sum", dtype, count, r, p)
        with problems.guard(f"allreduce count={count}"):
            expected = mpi_reference("allreduce", x, "sum", world)
            problems.expect_equal(
                f"allreduce {count}", collectives.allreduce(x, algorithm="shared_memory", comm=comm), expected
            )
            y = x.copy()
            collectives.allreduce(y, out=y, algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"allreduce in place {count}", y, expected)
        rows = count // p * p
        with problems.guard(f"reduce_scatter count={rows}"):
            expected = mpi_reference("reduce_scatter", x[:rows], "sum", world)
            got = collectives.reduce_scatter(x[:rows], algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"reduce_scatter {rows}", got, expected)
        with problems.guard(f"allgather count={count}"):
            got = collectives.allgather(x, algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"allgather {count}", got, np.concatenate(world.allgather(x)))
    comm.free()
    problems.check()
