"""The point-to-point interface every transport implements."""

__all__ = ["Request", "SharedMemory", "Transport"]

from abc import ABC, abstractmethod
from typing import Any

Request = Any
"""A transport's handle on a transfer in flight."""


class Transport(ABC):
    """Nonblocking sends and receives of bytes between the ranks of one group.

    Messages from one rank to another with the same tag arrive in the order
    they were sent, and receives are matched in the order they were posted,
    as in MPI. Buffers are those an :class:`~collectives.backends.ArrayBackend`
    gives from ``message()``; they must not be touched until the request completes.
    """

    @property
    @abstractmethod
    def rank(self) -> int:
        """This process's rank in the group."""

    @property
    @abstractmethod
    def size(self) -> int:
        """The number of ranks in the group."""

    @property
    def thread_level(self) -> str:
        """Which threads may use the transport, in MPI's terms.

        ``"multiple"``: any thread, at the same time as others; ``"serialized"``:
        any thread, one at a time; ``"funneled"``: only the main thread;
        ``"single"``: the process has one thread.
        """
        return "multiple"

    @abstractmethod
    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        """Start sending ``buffer`` to rank ``dst``."""

    @abstractmethod
    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        """Start receiving from rank ``src`` into the start of ``buffer``, which has room for the message."""

    @abstractmethod
    def waitall(self, requests: list[Request]) -> None:
        """Block until every request has completed."""

    def shared_memory(self) -> "SharedMemory | None":
        """The group's shared memory, if all its ranks share one node; ``None`` otherwise (the default).

        Collective the first time it is called.
        """
        return None

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        """Wait at most ``timeout`` seconds for ``requests``; the indices of those still pending.

        An empty list means every request completed. Pending requests stay
        valid and may be waited for again. This default waits without bound;
        transports that can stop waiting override it.
        """
        self.waitall(requests)
        return []

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:  # noqa: B027
        """Give up on requests a timeout left pending: cancel what can be, and let the process still end.

        The transport is not used afterwards. This default does nothing.
        """

    def close(self) -> None:  # noqa: B027 - most transports have nothing to release
        """Release what the transport holds; it is not used afterwards."""


class SharedMemory(ABC):
    """Memory that every rank of a group maps, each owning a region of it, and a barrier.

    Offered by a transport whose ranks all share one node (see
    :meth:`Transport.shared_memory`); the shared-memory executor reads and writes
    peers' regions directly instead of sending messages.
    """

    @property
    @abstractmethod
    def region_bytes(self) -> int:
        """Bytes of each rank's region."""

    @abstractmethod
    def region(self, rank: int) -> memoryview:
        """Rank ``rank``'s region, writable by every rank, as bytes."""

    @abstractmethod
    def barrier(self) -> None:
        """Return once every rank has called it; writes before it are visible to all ranks after it."""
