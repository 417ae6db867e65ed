"""Point-to-point over mpi4py: the only module that imports it."""

__all__ = ["MPITransport"]

import time
from typing import Any

from mpi4py import MPI

from .base import Request, Transport

_SPIN_S = 1e-3  # poll without sleeping this long first: a fast step never sleeps
_PAUSE_S = (20e-6, 2e-3)  # then sleep between polls, doubling from the first to the second


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
        # MPI_Waitall cannot be bounded, so poll with MPI_Testall; sleeping once
        # the spin is over leaves the core to the peers on an oversubscribed node
        start = time.monotonic()
        deadline = start + timeout
        pause = _PAUSE_S[0]
        while not MPI.Request.Testall(requests):
            now = time.monotonic()
            if now >= deadline:
                # Test completes what has finished; the rest are pending
                return [i for i, request in enumerate(requests) if not request.Test()]
            if now - start > _SPIN_S:
                time.sleep(min(pause, deadline - now))
                pause = min(2 * pause, _PAUSE_S[1])
        return []

    def close(self) -> None:
        if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._comm.Free()
