"""The point-to-point interface every transport implements."""

__all__ = ["Request", "Transport"]

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

    @abstractmethod
    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        """Start sending ``buffer`` to rank ``dst``."""

    @abstractmethod
    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        """Start receiving from rank ``src`` into ``buffer``, which has the message's exact size."""

    @abstractmethod
    def waitall(self, requests: list[Request]) -> None:
        """Block until every request has completed."""

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
