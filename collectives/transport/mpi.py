"""Point-to-point over mpi4py: the only module that imports it."""

__all__ = ["MPISharedMemory", "MPITransport"]

import atexit
import ctypes
import os
import sys
import time
from collections.abc import Sequence
from functools import cache
from typing import Any, cast

from mpi4py import MPI

from ..errors import ConfigurationError
from .base import Request, SharedMemory, Transport

CUDA_AWARE_ENV = "COLLECTIVES_CUDA_AWARE"
"""``1`` or ``0`` to say whether MPI takes CUDA device buffers, instead of asking the library."""

SHARED_REGION_BYTES = 1 << 21
"""Bytes of each rank's region of the shared window: two segments of 1 MiB, double-buffered."""

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}


class MPITransport(Transport):
    """Sends and receives on a private duplicate of an mpi4py communicator.

    The duplicate keeps the library's messages apart from the user's own
    traffic on the communicator they passed. Creating one is collective.
    """

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"expected an mpi4py intracommunicator, got {type(base).__name__}")
        self._comm = base.Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        self._shared: MPISharedMemory | None = None
        self._shared_known = False
        self._node_local: bool | None = None
        self._stuck: list[MPI.Request] = []  # sends a timeout left behind

    @classmethod
    def of_world_ranks(cls, ranks: Sequence[int], rank: int) -> "MPITransport":
        """A transport over ``ranks`` of ``MPI.COMM_WORLD``, numbered in that order.

        Collective over those ranks only (``MPI_Comm_create_group``), so the
        others need not take part.

        Args:
            ranks: ranks of ``MPI.COMM_WORLD``, the caller's among them.
            rank: the caller's rank in ``MPI.COMM_WORLD`` as the caller numbers
                it; checked against MPI's before any message, since members
                that disagree on who is in the group would wait for each other.
        """
        world = MPI.COMM_WORLD
        if world.Get_rank() != rank:
            raise ConfigurationError(f"the caller says it is rank {rank}; MPI says rank {world.Get_rank()}")
        if rank not in ranks:
            raise ConfigurationError(f"rank {rank} of MPI.COMM_WORLD is not in the group {list(ranks)}")
        everyone = world.Get_group()
        group = everyone.Incl(list(ranks))
        everyone.Free()
        try:
            sub = world.Create_group(group)
        finally:
            group.Free()
        try:
            return cls(sub)
        finally:
            sub.Free()

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def comm(self) -> MPI.Intracomm:
        """The library's private duplicate of the user's communicator."""
        return self._comm

    @property
    def thread_level(self) -> str:
        """The thread support MPI was initialised with (mpi4py asks for ``multiple``)."""
        return _THREAD_LEVELS.get(MPI.Query_thread(), "single")

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return self._comm.Isend([buffer, MPI.BYTE], dst, tag)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return self._comm.Irecv([buffer, MPI.BYTE], src, tag)

    def waitall(self, requests: list[Request]) -> None:
        MPI.Request.Waitall(requests)

    def shared_memory(self) -> "MPISharedMemory | None":
        if not self._shared_known:
            self._shared_known = True
            if self.node_local():
                node = cast(MPI.Intracomm, self._comm.Split_type(MPI.COMM_TYPE_SHARED))
                self._shared = MPISharedMemory(node, SHARED_REGION_BYTES)
        return self._shared

    def node_local(self) -> bool:
        if self._node_local is None:
            node = cast(MPI.Intracomm, self._comm.Split_type(MPI.COMM_TYPE_SHARED))
            self._node_local = bool(self._comm.allreduce(node.Get_size() == self._size, op=MPI.LAND))
            node.Free()
        return self._node_local

    def cuda_aware(self) -> bool:
        """``$COLLECTIVES_CUDA_AWARE`` if set, else what the MPI library says (``MPIX_Query_cuda_support``).

        Open MPI and MPICH both offer the query; an MPI without it is taken as not
        CUDA-aware. The ranks must agree, so set the variable alike on all of them.
        """
        text = os.environ.get(CUDA_AWARE_ENV, "").strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        if text:
            raise ConfigurationError(f"{CUDA_AWARE_ENV}={text!r} is neither 1 nor 0")
        return _mpi_cuda_support()

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        # MPI_Waitall cannot be bounded, so poll MPI_Testall. MPI moves large messages
        # only inside its calls, so a sleep between polls would stall them; yielding the
        # core instead lets oversubscribed peers run, as MPICH's heavy yield does
        deadline = time.monotonic() + timeout
        while not MPI.Request.Testall(requests):
            if time.monotonic() >= deadline:
                # Test completes what has finished; the rest are pending
                return [i for i, request in enumerate(requests) if not request.Test()]
            os.sched_yield()
        return []

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        # a receive can be cancelled; a send cannot (MPI-4 deprecates it), and MPI_Finalize
        # waits for it, so a process left with one aborts the job at exit rather than hang
        for request in receives:
            request.Cancel()
        deadline = time.monotonic() + 1.0
        while not MPI.Request.Testall(receives) and time.monotonic() < deadline:
            time.sleep(1e-3)
        if not self._stuck:
            atexit.register(self._abort_if_stuck)  # runs before mpi4py's own MPI_Finalize
        self._stuck.extend(sends)

    def _abort_if_stuck(self) -> None:
        if MPI.Is_finalized() or MPI.Request.Testall(self._stuck):
            return
        print(
            "collectives: a timed-out collective left sends that never completed; "
            "MPI_Finalize would wait for them forever, so the job is aborted",
            file=sys.stderr,
            flush=True,
        )
        MPI.COMM_WORLD.Abort(1)

    def close(self) -> None:
        if self._shared is not None and not MPI.Is_finalized():
            self._shared.free()
            self._shared = None
        if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._comm.Free()


@cache
def _mpi_cuda_support() -> bool:
    """``MPIX_Query_cuda_support()`` of the MPI library mpi4py loaded; ``False`` where it has none."""
    for path in _loaded_mpi_libraries():
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query())
    return False


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (mpi4py loads them privately)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


class MPISharedMemory(SharedMemory):
    """An MPI-3 shared window (``Win.Allocate_shared``) over the ranks of one node.

    Ranks keep a passive epoch open on the window for its whole life, so the
    barrier is the standard's ``Win.Sync``, ``Barrier``, ``Win.Sync``: stores before
    it are visible to every rank after it.
    """

    def __init__(self, node: MPI.Intracomm, region_bytes: int) -> None:
        self._node = node
        self._bytes = region_bytes
        self._win = MPI.Win.Allocate_shared(region_bytes, 1, comm=node)
        self._regions = [memoryview(self._win.Shared_query(r)[0]).cast("B") for r in range(node.Get_size())]  # type: ignore[arg-type]
        self._win.Lock_all(MPI.MODE_NOCHECK)

    @property
    def region_bytes(self) -> int:
        return self._bytes

    def region(self, rank: int) -> memoryview:
        return self._regions[rank]

    def barrier(self) -> None:
        self._win.Sync()
        self._node.Barrier()
        self._win.Sync()

    def free(self) -> None:
        """Release the window and the node's communicator; collective."""
        self._regions = []
        self._win.Unlock_all()
        self._win.Free()
        self._node.Free()
