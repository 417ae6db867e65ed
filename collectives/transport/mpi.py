"""Point-to-point over mpi4py: the only module that imports it."""

__all__ = ["MPITransport"]

import atexit
import os
import sys
import time
from typing import Any

from mpi4py import MPI

from .base import Request, Transport


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
        self._stuck: list[MPI.Request] = []  # sends a timeout left behind

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

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return self._comm.Isend([buffer, MPI.BYTE], dst, tag)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return self._comm.Irecv([buffer, MPI.BYTE], src, tag)

    def waitall(self, requests: list[Request]) -> None:
        MPI.Request.Waitall(requests)

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
        if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._comm.Free()
