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
        """Start receiving from rank ``src`` into ``buffer``, which has the message's exact size."""

    @abstractmethod
    def waitall(self, requests: list[Request]) -> None:
        """Block until every request has completed."""

    def close(self) -> None:  # noqa: B027 - most transports have nothing to release
        """Release what the transport holds; it is not used afterwards."""
