"""Under mpiexec: a call one rank saw time out never returns a result on a rank that comes late to it."""

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import BrokenCommunicatorError, CollectiveTimeout
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

TIMEOUT_S = 1.0
LATE_S = 2.5  # past the others' timeout


def _paths(comm: collectives.Communicator, x: np.ndarray) -> dict[str, Callable[[], Any]]:
    persistent = collectives.allreduce_init(x, comm=comm)
    return {
        "repeated on shared memory": lambda: collectives.allreduce(x, comm=comm),
        "repeated ring": lambda: collectives.allreduce(x, algorithm="ring", comm=comm),
        "persistent": persistent,
        "allgather": lambda: collectives.allgather(x, comm=comm),
        "broadcast": lambda: collectives.broadcast(x, 0, comm=comm),
        "reduce": lambda: collectives.reduce(x, root=0, comm=comm),
        "barrier": lambda: collectives.barrier(comm=comm),
    }


PATHS = [
    "repeated on shared memory", "repeated ring", "persistent", "allgather", "broadcast", "reduce", "barrier"
]  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_a_late_rank_learns_of_a_peers_timeout_before_its_call_returns(
    world: MPI.Intracomm, path: str
) -> None:
    if world.size != 2:
        pytest.skip("two ranks show it; each case waits out a timeout")
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=TIMEOUT_S)
    x = np.full(16, world.rank + 1, np.float32)
    call = _paths(comm, x)[path]
    for _ in range(3):  # the repeated path is taken from here on
        call()
    late = world.rank == world.size - 1
    if late:
        time.sleep(LATE_S)
    try:
        result = call()
        problems.expect(
            False, f"rank {world.rank} returned {np.ravel(result)[:2]} from the call rank 0 timed out on"
        )
    except CollectiveTimeout as error:  # waiting for a peer that left, the late rank times out too
        problems.expect(not late or "waiting for rank 0" in str(error), f"rank {world.rank}: {error}")
    except BrokenCommunicatorError as error:  # or, finding its data all there, learns of the timeout
        problems.expect(late and "timed out" in str(error), f"rank {world.rank}: {error}")
    world.Barrier()
    comm.free()
    problems.check()
