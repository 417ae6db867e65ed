"""Edges under mpiexec (issue 19, item 7): float16 averages, the debug file, parameter names, bool roots."""

from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.errors import ConfigurationError, InvalidRootError, MismatchError
from tests.mpi.helpers import Problems, algorithms_for

pytestmark = pytest.mark.mpi


@pytest.mark.parametrize("algorithm", algorithms_for("allreduce"))
def test_float16_avg_whose_sum_overflows_is_finite_on_every_path(
    algorithm: str, world: MPI.Intracomm
) -> None:
    problems = Problems(world)
    expected = np.full(1003, 40_000, np.float16)
    with problems.guard(algorithm):
        for label in ("first", "repeated"):  # the repeat runs the prepared path
            x = np.full(1003, 40_000, np.float16)
            problems.expect_equal(label, collectives.allreduce(x, "avg", algorithm=algorithm), expected)
            collectives.allreduce(x, "avg", out=x, algorithm=algorithm)
            problems.expect_equal(f"{label}, in place", x, expected)
    problems.check()


def test_float16_avg_of_reduce_scatter_and_reduce_is_finite(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with problems.guard("reduce_scatter, reduce"):
        x = np.full(4 * world.size, 40_000, np.float16)
        for _ in range(2):
            share = collectives.reduce_scatter(x, "avg")
            problems.expect_equal("reduce_scatter", share, np.full(4, 40_000, np.float16))
        reduced = collectives.reduce(x, "avg", root=world.size - 1)
        if world.rank == world.size - 1:
            problems.expect_equal("reduce", reduced, x)
    problems.check()


def test_a_debug_file_in_a_missing_folder_is_refused_on_every_rank(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    folder = Path("/nonexistent-collectives-folder")
    monkeypatch.setenv("COLLECTIVES_DEBUG", "1")
    monkeypatch.setenv("COLLECTIVES_DEBUG_FILE", str(folder / "log-{rank}.txt"))
    try:
        collectives.Communicator(world)
        problems.expect(False, "a communicator was made")
    except ConfigurationError as error:
        problems.expect(str(folder) in str(error), f"the error does not name the folder: {error}")
    problems.check()


def test_root_false_is_refused(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    try:
        collectives.broadcast(np.ones(3), root=False)
        problems.expect(False, "root=False was taken as rank 0")
    except InvalidRootError:
        pass
    problems.check()


def test_broadcast_parameters_matches_by_name(world: MPI.Intracomm) -> None:
    torch = pytest.importorskip("torch")
    from collectives import torch_integration as ti

    problems = Problems(world)
    with problems.guard("reordered"):
        params = {"a": torch.full((3,), 1.0 + world.rank), "b": torch.full((5,), 10.0 + world.rank)}
        if world.rank % 2:
            params = dict(reversed(list(params.items())))
        ti.broadcast_parameters(params, root_rank=0)
        problems.expect(params["a"].tolist() == [1.0] * 3 and params["b"].tolist() == [10.0] * 5, "values")
    renamed = {"a": torch.zeros(3), ("b" if world.rank == 0 else "c"): torch.zeros(3)}
    try:
        ti.broadcast_parameters(renamed, root_rank=0)
        problems.expect(world.size == 1, "other names passed")
    except MismatchError:
        pass
    problems.check()
