"""Device messages over a host transport, through pinned host buffers kept in a pool."""

__all__ = ["PinnedPool", "StagingTransport"]

from typing import Any

from .base import Request, SharedMemory, Transport, WrappedTransport
from .device import Device

_SMALLEST = 1 << 12


class PinnedPool:
    """Page-locked host buffers, each lent for one message and then kept for the next.

    Capacities are powers of two (4 KiB at least); a buffer is allocated only when
    no free one of the message's capacity is left, so a call that repeats an earlier
    one's messages allocates nothing.

    Attributes:
        allocations: buffers allocated so far.
        allocated_bytes: bytes of every buffer allocated so far.
    """

    def __init__(self, device: Device) -> None:
        self._device = device
        self._free: dict[int, list[Any]] = {}
        self.allocations = 0
        self.allocated_bytes = 0

    @staticmethod
    def capacity(nbytes: int) -> int:
        """The capacity of the buffer lent for ``nbytes`` bytes."""
        return max(_SMALLEST, 1 << (nbytes - 1).bit_length())

    def acquire(self, nbytes: int) -> Any:
        """A host buffer of at least ``nbytes`` bytes, lent until :meth:`release`."""
        capacity = self.capacity(nbytes)
        free = self._free.get(capacity)
        if free:
            return free.pop()
        self.allocations += 1
        self.allocated_bytes += capacity
        return self._device.pinned(capacity)

    def release(self, buffer: Any) -> None:
        """Take back a buffer :meth:`acquire` lent."""
        self._free.setdefault(len(buffer), []).append(buffer)

    @property
    def free_buffers(self) -> int:
        """Buffers in the pool now, not lent."""
        return sum(len(free) for free in self._free.values())

    def clear(self) -> None:
        """Let go of the free buffers."""
        self._free.clear()


class _Staged:
    """An inner transport's request, the host buffer it uses and, for a receive, the device target."""

    __slots__ = ("done", "host", "request", "target")

    def __init__(self, request: Request, host: Any, target: Any) -> None:
        self.request = request
        self.host = host
        self.target = target
        self.done = False


class StagingTransport(WrappedTransport):
    """A transport for device buffers over one that moves only host memory.

    A device message is copied into a pinned host buffer before its send is posted,
    and a device receive lands in one and is copied to the device when it completes,
    in :meth:`waitall` or :meth:`wait_for`, so before the executor reduces it. With
    the executor's segmented messages the copies of one segment overlap the transfer
    of the next. Host buffers pass through untouched. The pinned buffers come from a
    :class:`PinnedPool` kept across calls.

    Args:
        inner: the host transport (the communicator's).
        device: the device the buffers are on.
        pool: the pinned buffers; a new pool when omitted.
    """

    def __init__(self, inner: Transport, device: Device, pool: PinnedPool | None = None) -> None:
        super().__init__(inner)
        self._device = device
        self.pool = PinnedPool(device) if pool is None else pool

    def shared_memory(self) -> SharedMemory | None:
        return None  # the shared-memory executor reads host memory only

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        if not self._device.is_device(buffer):
            return _Staged(self._inner.isend(buffer, dst, tag), None, None)
        nbytes = len(buffer)
        host = self.pool.acquire(nbytes)
        self._device.to_host(host[:nbytes], buffer)
        return _Staged(self._inner.isend(host[:nbytes], dst, tag), host, None)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        if not self._device.is_device(buffer):
            return _Staged(self._inner.irecv(buffer, src, tag), None, None)
        host = self.pool.acquire(len(buffer))
        return _Staged(self._inner.irecv(host[: len(buffer)], src, tag), host, buffer)

    def waitall(self, requests: list[Request]) -> None:
        live = [r for r in requests if not r.done]
        self._inner.waitall([r.request for r in live])
        for staged in live:
            self._finish(staged)

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        live = [i for i, r in enumerate(requests) if not r.done]
        pending = self._inner.wait_for([requests[i].request for i in live], timeout)
        still = {live[i] for i in pending}
        for i in live:
            if i not in still:
                self._finish(requests[i])
        return sorted(still)

    def _finish(self, staged: _Staged) -> None:
        staged.done = True
        if staged.host is None:
            return
        if staged.target is not None:
            self._device.to_device(staged.target, staged.host[: len(staged.target)])
        self.pool.release(staged.host)
        staged.host = None

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        # the inner transport may still write or read their host buffers: they never go back to the pool
        self._inner.abandon([r.request for r in receives], [r.request for r in sends])

    def close(self) -> None:
        """Free the pool's buffers; the inner transport is its owner's to close."""
        self.pool.clear()
