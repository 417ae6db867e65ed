"""Ranks as threads of one process, for tests and for trying schedules without MPI."""

__all__ = ["LoopbackTransport", "LoopbackWorld"]

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from ..errors import CollectiveTimeout, TransportError
from .base import Request, Transport

T = TypeVar("T")


class LoopbackWorld:
    """A group of ``size`` in-process ranks exchanging messages through shared mailboxes.

    A send copies its bytes into the receiver's mailbox and completes at once;
    a receive waits for the next message from its source with its tag. No wait
    outlasts ``timeout`` seconds, and once any rank fails the others stop waiting.
    """

    def __init__(self, size: int, *, timeout: float = 60.0) -> None:
        if size < 1:
            raise ValueError(f"world size must be at least 1, got {size}")
        self.size = size
        self.timeout = timeout
        self._mailboxes: dict[tuple[int, int, int], deque[bytes]] = {}
        self._changed = threading.Condition()
        self._failure: str | None = None

    def transport(self, rank: int) -> "LoopbackTransport":
        """The transport of ``rank``."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is outside 0..{self.size - 1}")
        return LoopbackTransport(self, rank)

    def run(self, fn: Callable[[Transport], T]) -> list[T]:
        """Call ``fn(transport)`` for every rank in its own thread; return the results in rank order.

        If any rank raises, the first such error (by rank) is raised here once
        every thread has ended.
        """
        results: list[Any] = [None] * self.size
        errors: list[BaseException | None] = [None] * self.size

        def body(rank: int) -> None:
            try:
                results[rank] = fn(self.transport(rank))
            except BaseException as exc:
                errors[rank] = exc
                self.abort(f"rank {rank} failed: {exc!r}")

        threads = [threading.Thread(target=body, args=(r,), name=f"rank-{r}") for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # an error of a rank's own outranks the aborts it caused in the others
        first = next((e for e in errors if e is not None and not _is_abort(e)), None)
        first = first or next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return results

    def abort(self, reason: str) -> None:
        """Make every waiting and future receive fail with ``reason``."""
        with self._changed:
            if self._failure is None:
                self._failure = reason
            self._changed.notify_all()

    def post(self, src: int, dst: int, tag: int, data: bytes) -> None:
        """Leave ``data`` in ``dst``'s mailbox for ``src`` and ``tag`` (its transports' sends)."""
        with self._changed:
            self._mailboxes.setdefault((src, dst, tag), deque()).append(data)
            self._changed.notify_all()

    def take(self, src: int, dst: int, tag: int, until: float | None = None) -> bytes | None:
        """The next message, or ``None`` once the monotonic time ``until`` has passed."""
        deadline = time.monotonic() + self.timeout
        with self._changed:
            while True:
                if self._failure is not None:
                    raise _Aborted(f"rank {dst} stopped waiting for rank {src}: {self._failure}")
                box = self._mailboxes.get((src, dst, tag))
                if box:
                    return box.popleft()
                now = time.monotonic()
                if until is not None and now >= until:
                    return None
                left = deadline - now
                if left <= 0:
                    raise CollectiveTimeout(
                        f"rank {dst} waited {self.timeout:g} s for a message from rank {src} (tag {tag})"
                    )
                self._changed.wait(left if until is None else min(left, until - now))

    def probe(self, dst: int, tag: int, until: float) -> tuple[int, int] | None:
        """Source and size of the first message to ``dst`` with ``tag``; ``None`` once ``until`` passed."""
        with self._changed:
            while True:
                if self._failure is not None:
                    raise _Aborted(f"rank {dst} stopped probing: {self._failure}")
                for src in range(self.size):
                    box = self._mailboxes.get((src, dst, tag))
                    if box:
                        return src, len(box[0])
                left = until - time.monotonic()
                if left <= 0:
                    return None
                self._changed.wait(left)


class _Aborted(TransportError):
    """Another rank failed while this one was waiting."""


def _is_abort(exc: BaseException) -> bool:
    return isinstance(exc, _Aborted)


class _Receive:
    __slots__ = ("buffer", "done", "src", "tag")

    def __init__(self, buffer: Any, src: int, tag: int) -> None:
        self.buffer = buffer
        self.src = src
        self.tag = tag
        self.done = False


class LoopbackTransport(Transport):
    """One rank's end of a :class:`LoopbackWorld`."""

    def __init__(self, world: LoopbackWorld, rank: int) -> None:
        self._world = world
        self._rank = rank

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._world.size

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        self._check_peer(dst)
        self._world.post(self._rank, dst, tag, bytes(memoryview(buffer).cast("B")))
        return None

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        self._check_peer(src)
        return _Receive(buffer, src, tag)

    def waitall(self, requests: list[Request]) -> None:
        self.wait_for(requests, math.inf)  # the world's own timeout still bounds each receive

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        until = time.monotonic() + timeout
        for i, request in enumerate(requests):
            if isinstance(request, _Receive) and not request.done:
                data = self._world.take(request.src, self._rank, request.tag, until)
                if data is None:
                    return [j for j in range(i, len(requests)) if isinstance(requests[j], _Receive)]
                self._deliver(request, data)
        return []

    def probe(self, tag: int, timeout: float) -> tuple[int, int] | None:
        return self._world.probe(self._rank, tag, time.monotonic() + timeout)

    def _deliver(self, request: "_Receive", data: bytes) -> None:
        target = memoryview(request.buffer).cast("B")
        if len(data) > len(target):
            raise TransportError(
                f"rank {self._rank} had room for {len(target)} bytes from rank {request.src}, got {len(data)}"
            )
        target[: len(data)] = data
        request.done = True

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self._world.size:
            raise TransportError(f"rank {peer} is outside 0..{self._world.size - 1}")
