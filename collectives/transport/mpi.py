"""Point-to-point over mpi4py: the only module that imports it."""

__all__ = ["MPITransport"]

from typing import Any

from mpi4py import MPI

from .base import Request, Transport

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

    def close(self) -> None:
        if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._comm.Free()
