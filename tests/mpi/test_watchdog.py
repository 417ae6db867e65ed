"""Under mpiexec: mismatched calls raise on every rank; a rank that never comes makes the others time out."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import CollectiveTimeout, MismatchError
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi


def test_a_mismatch_raises_on_every_rank(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("one rank always agrees with itself")
    problems = Problems(world)
    last = world.size - 1
    comm = collectives.Communicator(world, check=True)  # whatever $COLLECTIVES_CHECK says
    x = np.ones(10 if world.rank != last else 11, np.float32)
    try:
        collectives.allreduce(x, comm=comm)
        problems.expect(False, "allreduce of unequal counts did not raise")
    except MismatchError as error:
        others = ", ".join(map(str, range(last)))
        problems.expect(
            error.fields == {"count": {"10": tuple(range(last)), "11": (last,)}},
            f"fields {error.fields}",
        )
        problems.expect(
            f"count: 10 on rank{'s' if last > 1 else ''} {others}; 11 on rank {last}" in str(error),
            str(error),
        )
    # the communicator is still in step: the next call agrees and runs
    with problems.guard("allreduce after the mismatch"):
        result = collectives.allreduce(np.ones(3, np.float32), comm=comm)
        problems.expect((result == world.size).all(), f"got {result}")
    comm.free()
    problems.check()


@pytest.mark.parametrize("check", [True, False])
def test_a_rank_that_never_calls_makes_the_others_time_out(world: MPI.Intracomm, check: bool) -> None:
    if world.size == 1:
        pytest.skip("needs a rank to stay away")
    problems = Problems(world)
    last = world.size - 1
    comm = collectives.Communicator(world, timeout=1.0, check=check)
    if world.rank != last:
        started = time.monotonic()
        try:
            collectives.allreduce(np.ones(16, np.float64), algorithm="ring", comm=comm)
            problems.expect(False, "allreduce without the last rank did not time out")
        except CollectiveTimeout as error:
            took = time.monotonic() - started
            problems.expect(1.0 <= took < 10, f"timed out after {took:.1f} s, expected 1 s")
            problems.expect(error.collective == "allreduce" and error.sequence == 0, str(error))
            if check:
                problems.expect(error.step == "signature" and error.peers == (last,), str(error))
            else:
                # the ring's neighbours wait for the last rank; the others for whoever waits on it
                problems.expect(isinstance(error.step, int) and len(error.peers) > 0, str(error))
            problems.expect("#0 allreduce count=16 dtype=float64" in str(error), "no flight recorder")
    # MPI cannot cancel the messages posted to the absent rank, so the communicator is not freed
    problems.check()


@pytest.mark.parametrize("check", [True, False])
def test_a_rank_late_to_a_cold_auto_call_times_every_rank_out(world: MPI.Intracomm, check: bool) -> None:
    """The first ``"auto"`` call finds the nodes and agrees on the selector: both under the timeout.

    The late rank finds the messages the others sent before they timed out, so it
    must still time out itself rather than wait forever in MPI's node split.
    """
    if world.size == 1:
        pytest.skip("needs a rank to come late")
    problems = Problems(world)
    late = world.size - 1
    timeout = 1.0
    comm = collectives.Communicator(world, timeout=timeout, check=check)
    if world.rank == late:
        time.sleep(3 * timeout)
    started = time.monotonic()
    outcome = "ok"
    try:
        collectives.allreduce(np.ones(16, np.float32), algorithm="auto", comm=comm)
    except CollectiveTimeout as error:
        outcome = "timed out"
        took = time.monotonic() - started
        problems.expect(timeout <= took < timeout + 5, f"timed out after {took:.1f} s, expected {timeout} s")
        problems.expect(error.collective == "allreduce" and error.sequence == 0, str(error))
        if world.rank == late:
            problems.expect(error.step == "the node split", str(error))
    # the user's communicator, not the library's broken duplicate: every rank says how its call ended
    outcomes = world.allgather(outcome)
    problems.expect(outcomes == ["timed out"] * world.size, f"outcomes by rank: {outcomes}")
    problems.check()


@pytest.mark.parametrize("check", [True, False])
def test_a_rank_late_to_the_first_device_call_times_every_rank_out(
    world: MPI.Intracomm, check: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first call on device arrays asks MPI which ranks share a node (``Split_type``): under the timeout.

    With CUDA IPC allowed, choosing the device path splits the communicator by node,
    which MPI cannot bound; the ranks meet by bounded messages first.
    """
    if world.size == 1:
        pytest.skip("needs a rank to come late")
    from collectives.backends import choice
    from collectives.backends.numpy_backend import NumpyBackend
    from tests.fake_device import DeviceArray, FakeDeviceBackend

    monkeypatch.delenv("COLLECTIVES_CUDA_IPC", raising=False)  # allowed: the path asks for the nodes
    monkeypatch.setattr(choice, "_BACKENDS", [FakeDeviceBackend(), NumpyBackend()])
    problems = Problems(world)
    late = world.size - 1
    timeout = 1.0
    comm = collectives.Communicator(world, timeout=timeout, check=check)
    if world.rank == late:
        time.sleep(3 * timeout)
    outcome = "ok"
    try:
        collectives.allreduce(np.ones(16, np.float32).view(DeviceArray), algorithm="ring", comm=comm)
    except CollectiveTimeout as error:
        outcome = "timed out"
        problems.expect(error.collective == "allreduce" and error.sequence == 0, str(error))
        if world.rank == late:
            problems.expect(error.step == "the device path", str(error))
    outcomes = world.allgather(outcome)
    problems.expect(outcomes == ["timed out"] * world.size, f"outcomes by rank: {outcomes}")
    problems.check()
