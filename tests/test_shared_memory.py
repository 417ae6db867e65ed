"""Shared memory without MPI: the watchdog bounds its barriers; alloc without it is a plain array."""

import math
import time
from collections.abc import Sequence

import numpy as np
import pytest

import collectives
from collectives.errors import CollectiveTimeout, InvalidBufferError, TransportError
from collectives.transport.base import SharedMemory
from collectives.transport.loopback import LoopbackWorld
from collectives.watchdog import Watchdog


class _OnePeerNeverComes(SharedMemory):
    """Rank 0 of two, whose peer (rank 1) never arrives."""

    def __init__(self) -> None:
        self.notes: list[tuple[int, ...]] = []
        self.waited: list[float] = []
        self.abandoned = False

    @property
    def region_bytes(self) -> int:
        return 0

    def region(self, rank: int) -> memoryview:
        return memoryview(b"")

    def arrive(self, note: Sequence[int] = ()) -> None:
        self.notes.append(tuple(note))

    def wait(self, timeout: float = math.inf) -> list[int]:
        self.waited.append(timeout)
        time.sleep(min(timeout, 0.05))
        return [1]

    def note(self, rank: int) -> tuple[int, ...]:
        return (0,) * self.NOTE_INTS

    def abandon(self) -> None:
        self.abandoned = True


def test_a_barrier_no_peer_reaches_times_out_naming_it() -> None:
    transport = LoopbackWorld(2).transport(0)
    watchdog = Watchdog(transport, timeout=0.3, stall_warning=0.1, check=False)
    shared = _OnePeerNeverComes()
    started = time.monotonic()
    stuck = r"stuck in barrier 0 waiting for rank 1"
    with (
        pytest.raises(CollectiveTimeout, match=stuck) as caught,
        watchdog.collective("allreduce", "shared_memory", 8) as call,
    ):
        call.barrier(shared, (7, 8))
    assert time.monotonic() - started < 5
    assert caught.value.peers == (1,) and caught.value.step == "barrier 0"
    # one arrival, then a wait to the stall warning, then one to the deadline
    assert shared.notes == [(7, 8)] and len(shared.waited) == 2 and shared.abandoned
    with (
        pytest.raises(TransportError, match="unusable"),
        watchdog.collective("allreduce", "shared_memory", 8),
    ):
        pass


def test_alloc_without_shared_memory_is_a_plain_array_that_reduces() -> None:
    world = LoopbackWorld(2)

    def body(transport: collectives.transport.base.Transport) -> np.ndarray:
        comm = collectives.Communicator(transport)
        assert "shared_memory" not in comm.features
        x = comm.alloc((3, 2), "int32")
        assert isinstance(x, np.ndarray) and x.shape == (3, 2) and x.dtype == np.int32
        assert x.flags.c_contiguous and x.flags.writeable
        x[:] = comm.rank + 1
        with pytest.raises(InvalidBufferError, match="shape of non-negative integers"):
            comm.alloc((2, -1))
        assert comm.alloc(0, np.float64).shape == (0,)
        return collectives.allreduce(x, out=x, comm=comm)

    for result in world.run(body):
        assert (result == 3).all()
