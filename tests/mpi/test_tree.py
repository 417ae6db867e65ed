"""The trees under mpiexec, pipelined deeper than the default picks at these counts."""

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.algorithms import double_tree, tree
from collectives.backends.numpy_backend import NumpyBackend
from collectives.execute import execute
from collectives.ops import get_op
from tests.mpi.helpers import Problems, counts_for, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

MODULES = {"tree": tree, "double_tree": double_tree}


@contextmanager
def _communicator(world: MPI.Intracomm) -> Iterator[collectives.Communicator]:
    communicator = collectives.Communicator(world)
    try:
        yield communicator
    finally:
        communicator.free()


@pytest.mark.parametrize("algorithm", MODULES)
@pytest.mark.parametrize(("dtype", "op"), [("int32", "sum"), ("float64", "max")])
def test_pipelined_trees_match_mpi(algorithm: str, dtype: str, op: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with _communicator(world) as communicator:
        for count in counts_for(world.size):
            x = exact_input(op, dtype, count, world.rank, world.size)
            expected = mpi_reference("allreduce", x, op, world)
            for chunks in (2, 3, 7):
                label = f"count={count} chunks={chunks}"
                buffer = x.copy()
                with problems.guard(label):
                    schedule = MODULES[algorithm].allreduce(world.size, count, chunks)
                    execute(schedule, communicator.transport, NumpyBackend(), buffer, get_op(op))
                    problems.expect_equal(label, buffer, expected)
    problems.check()


@pytest.mark.parametrize("algorithm", MODULES)
def test_pipelined_trees_give_the_same_bits_everywhere(algorithm: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    x = np.random.default_rng(30_000 + world.rank).normal(size=1003).astype(np.float32)
    with _communicator(world) as communicator:
        for chunks in (2, 5):
            buffer = x.copy()
            with problems.guard(f"chunks={chunks}"):
                schedule = MODULES[algorithm].allreduce(world.size, x.size, chunks)
                execute(schedule, communicator.transport, NumpyBackend(), buffer, get_op("sum"))
            first = np.frombuffer(world.bcast(buffer.tobytes(), root=0), buffer.dtype)
            problems.expect_equal(f"chunks={chunks} against rank 0", buffer, first)
    problems.check()
