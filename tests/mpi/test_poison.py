"""Under mpiexec: a call that is bad on one rank fails on every rank at once, and the next call runs."""

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import (
    InvalidBufferError,
    InvalidRootError,
    MismatchError,
    PeerInputError,
    UnsupportedDtypeError,
    UnsupportedOpError,
    backends,
)
from tests.fake_device import DeviceArray, FakeDeviceBackend
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

TIMEOUT_S = 20.0
"""The communicator's timeout: a rank left waiting raises CollectiveTimeout after this."""

Call = Callable[[collectives.Communicator, np.ndarray], Any]

# (collective, call on a good rank, call on the bad rank, the bad rank's error)
CASES: list[tuple[str, Call, Call, type]] = [
    ("allreduce", lambda c, x: collectives.allreduce(x, out=np.empty_like(x), comm=c),
     lambda c, x: collectives.allreduce(x, out=np.empty(x.size + 1, x.dtype), comm=c), InvalidBufferError),
    ("allreduce", lambda c, x: collectives.allreduce(x.astype(np.int32), "max", comm=c),
     lambda c, x: collectives.allreduce(x.astype(np.int32), "avg", comm=c), UnsupportedOpError),
    ("allreduce", lambda c, x: collectives.allreduce(x, comm=c),
     lambda c, x: collectives.allreduce(x.astype(np.complex64), comm=c), UnsupportedDtypeError),
    ("reduce_scatter", lambda c, x: collectives.reduce_scatter(x, out=x[: x.size // c.size].copy(), comm=c),
     lambda c, x: collectives.reduce_scatter(x, out=x[:1].copy(), comm=c), InvalidBufferError),
    ("allgather", lambda c, x: collectives.allgather(x, comm=c),
     lambda c, x: collectives.allgather(x, out=np.empty(x.size * c.size, np.float64), comm=c),
     InvalidBufferError),
    ("broadcast", lambda c, x: collectives.broadcast(x, root=0, comm=c),
     lambda c, x: collectives.broadcast(x, root=c.size, comm=c), InvalidRootError),
    ("reduce", lambda c, x: collectives.reduce(x, "sum", root=0, comm=c),
     lambda c, x: collectives.reduce(x, "total", root=0, comm=c), UnsupportedOpError),
]  # fmt: skip


@pytest.mark.parametrize(("collective", "good", "bad", "kind"), CASES)
def test_a_bad_call_on_one_rank_fails_on_every_rank_at_once(
    world: MPI.Intracomm, collective: str, good: Call, bad: Call, kind: type
) -> None:
    if world.size == 1:
        pytest.skip("needs a good rank beside the bad one")
    problems = Problems(world)
    last = world.size - 1
    comm = collectives.Communicator(world, timeout=TIMEOUT_S, check=True)
    x = np.arange(4 * world.size, dtype=np.float32) + world.rank
    started = time.monotonic()
    try:
        (bad if world.rank == last else good)(comm, x)
        problems.expect(False, f"{collective} with a bad call on rank {last} did not raise")
    except PeerInputError as error:
        problems.expect(world.rank != last, f"the bad rank raised PeerInputError: {error}")
        problems.expect(list(error.problems) == [last], f"problems {error.problems}")
        problems.expect(
            f"{collective} #0: the call failed its checks on rank {last} ({kind.__name__}: " in str(error),
            str(error),
        )
    except Exception as error:
        problems.expect(type(error) is kind and world.rank == last, f"raised {type(error).__name__}: {error}")
    took = time.monotonic() - started
    problems.expect(took < TIMEOUT_S / 2, f"took {took:.1f} s to raise")
    # the sequence numbers stayed in step: the next call agrees and runs
    with problems.guard(f"allreduce after the bad {collective}"):
        result = collectives.allreduce(np.ones(3, np.float32), comm=comm)
        problems.expect((result == world.size).all(), f"got {result}")
    comm.free()
    problems.check()


def test_host_and_device_arrays_in_one_call_are_a_mismatch(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("one rank always agrees with itself")
    problems = Problems(world)
    with backends.trying_first(FakeDeviceBackend()):
        comm = collectives.Communicator(world, timeout=TIMEOUT_S, check=True)
        x = np.ones(8, np.float32)
        # the device path (a named algorithm); a small "auto" call runs on a host copy, below
        try:
            collectives.allreduce(x.view(DeviceArray) if world.rank == 0 else x, algorithm="ring", comm=comm)
            problems.expect(False, "allreduce of a device array and host arrays did not raise")
        except MismatchError as error:
            others = tuple(range(1, world.size))
            expected = {"backend": {"fake-device": (0,), "numpy": others}}
            problems.expect(error.fields == expected, f"fields {error.fields}")
        with problems.guard("allreduce after the mismatch"):
            result = collectives.allreduce(np.ones(3, np.float32), comm=comm)
            problems.expect((result == world.size).all(), f"got {result}")
        with problems.guard("a small auto allreduce of a device array against host arrays"):
            result = collectives.allreduce(x.view(DeviceArray) if world.rank == 0 else x, comm=comm)
            problems.expect(isinstance(result, DeviceArray) == (world.rank == 0), f"got a {type(result)}")
            problems.expect((result == world.size).all(), f"got {result}")
        comm.free()
    problems.check()
