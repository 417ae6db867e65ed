"""Device messages over a host transport, in pieces through pinned host buffers kept in a pool."""

__all__ = ["PIECES_IN_FLIGHT", "PIECE_BYTES", "PinnedPool", "StagingTransport", "pieces"]

import math
import os
import time
from collections import deque
from typing import Any

from .base import Request, SharedMemory, Transport, WrappedTransport
from .device import GpuDevice

PIECE_BYTES = 1 << 22
"""Bytes of the largest piece of a staged device message: a larger message goes as several
host messages of at most this size, so no pinned buffer is larger. Read when a
:class:`StagingTransport` is made; every rank must use the same."""

PIECES_IN_FLIGHT = 2
"""Pinned buffers one peer's messages of one tag may hold at a time in each direction, so the
copy of one piece between device and host overlaps the transfer of the next. Read when a
:class:`StagingTransport` is made."""

_SMALLEST = 1 << 12
_NAP_S = 1e-3  # the longest a wait that saw no progress blocks on one piece before looking again


def pieces(nbytes: int, piece_bytes: int) -> list[tuple[int, int]]:
    """The byte ranges a message of ``nbytes`` is cut into: every piece ``piece_bytes`` but the last.

    A message of no bytes is one empty piece, so that it is still a message. Both
    sides of a message cut it alike from its size alone.
    """
    if nbytes == 0:
        return [(0, 0)]
    return [(lo, min(lo + piece_bytes, nbytes)) for lo in range(0, nbytes, piece_bytes)]


class PinnedPool:
    """Page-locked host buffers, each lent for one piece of a message and then kept for the next.

    Capacities are powers of two (4 KiB at least); a buffer is allocated only when
    no free one of the piece's capacity is left, so a call that repeats an earlier
    one's messages allocates nothing. The buffers lent at once are bounded by the
    transport that borrows them, so the pool's memory is bounded by its pieces, not
    by the size of the messages.

    Attributes:
        allocations: buffers allocated so far.
        allocated_bytes: bytes of every buffer allocated so far.
        lent: buffers lent now.
        most_lent: the most buffers lent at once so far.
    """

    def __init__(self, device: GpuDevice) -> None:
        self._device = device
        self._free: dict[int, list[Any]] = {}
        self.allocations = 0
        self.allocated_bytes = 0
        self.lent = 0
        self.most_lent = 0

    @staticmethod
    def capacity(nbytes: int) -> int:
        """The capacity of the buffer lent for ``nbytes`` bytes."""
        return max(_SMALLEST, 1 << (nbytes - 1).bit_length())

    def acquire(self, nbytes: int) -> Any:
        """A host buffer of at least ``nbytes`` bytes, lent until :meth:`release`."""
        capacity = self.capacity(nbytes)
        self.lent += 1
        self.most_lent = max(self.most_lent, self.lent)
        free = self._free.get(capacity)
        if free:
            return free.pop()
        self.allocations += 1
        self.allocated_bytes += capacity
        return self._device.pinned(capacity)

    def release(self, buffer: Any) -> None:
        """Take back a buffer :meth:`acquire` lent."""
        self.lent -= 1
        self._free.setdefault(len(buffer), []).append(buffer)

    def forget(self, buffer: Any) -> None:
        """Count a lent buffer as gone for good: it is never taken back (a transfer may still use it)."""
        self.lent -= 1

    @property
    def free_buffers(self) -> int:
        """Buffers in the pool now, not lent."""
        return sum(len(free) for free in self._free.values())

    def clear(self) -> None:
        """Let go of the free buffers."""
        self._free.clear()


class _PostedMessage:
    """A send or receive the caller posted: its buffer, cut into pieces, and how far it has gone."""

    __slots__ = ("buffer", "device", "done", "landed", "posted", "ranges")

    def __init__(self, buffer: Any, device: bool, piece_bytes: int) -> None:
        self.buffer = buffer
        self.device = device
        # a host message goes whole, as the caller gave it
        self.ranges = pieces(len(buffer), piece_bytes) if device else [(0, 0)]
        self.posted = 0  # pieces handed to the inner transport
        self.landed = 0  # pieces the inner transport completed (and, received, copied to the device)
        self.done = False


class _Piece:
    """One piece in flight on the inner transport: its message, byte range, request and host buffer."""

    __slots__ = ("hi", "host", "lo", "message", "request")

    def __init__(self, message: _PostedMessage, lo: int, hi: int, request: Request, host: Any) -> None:
        self.message = message
        self.lo = lo
        self.hi = hi
        self.request = request
        self.host = host  # the pinned buffer; None for a host message or an empty piece


class _Channel:
    """The messages to or from one peer under one tag, in one direction, in the order they were posted.

    Their pieces are posted to the inner transport strictly in that order, so the
    n-th piece sent is the n-th piece the peer receives, whatever the timing.
    """

    __slots__ = ("flight", "peer", "pinned", "queue", "sends", "tag")

    def __init__(self, peer: int, tag: int, sends: bool) -> None:
        self.peer = peer
        self.tag = tag
        self.sends = sends
        self.queue: deque[_PostedMessage] = deque()  # messages with pieces not yet posted
        self.flight: deque[_Piece] = deque()  # pieces posted and not yet landed, oldest first
        self.pinned = 0  # pinned buffers the pieces in flight hold


class StagingTransport(WrappedTransport):
    """A transport for device buffers over one that moves only host memory.

    A device message goes in pieces of at most ``piece_bytes`` (the last one
    shorter), each a host message of its own under the message's tag. A sent piece
    is copied from the device into a pinned host buffer just before its send is
    posted; a received piece lands in one and is copied to the device as soon as it
    has arrived, before the next piece is posted in its place. The messages to or
    from one peer under one tag hold at most ``pieces_in_flight`` pinned buffers at
    a time in each direction: while one piece is on the wire the next is copied,
    and the pool's memory stays bounded by pieces whatever the size of the messages.

    Pieces move while the caller waits (:meth:`waitall`, :meth:`wait_for`) or
    posts, each wait advancing every message in flight, as MPI's progress does. A
    request completes once its whole message is sent, or has landed on the device
    (the copies are ordered on the device's stream, before the reductions that
    follow). Host buffers pass through as they are, in order with the device
    messages of their peer and tag. A device receive must be of the exact size of
    its message, since both sides cut it from its size.

    Args:
        inner: the host transport (the communicator's).
        device: the device the buffers are on.
        pool: the pinned buffers; a new pool when omitted.
        piece_bytes: the largest piece; :data:`PIECE_BYTES` when omitted. Every rank must pass the same.
        pieces_in_flight: pinned buffers per peer, tag and direction; :data:`PIECES_IN_FLIGHT` when omitted.
    """

    def __init__(
        self,
        inner: Transport,
        device: GpuDevice,
        pool: PinnedPool | None = None,
        *,
        piece_bytes: int | None = None,
        pieces_in_flight: int | None = None,
    ) -> None:
        super().__init__(inner)
        self._device = device
        self.pool = PinnedPool(device) if pool is None else pool
        self.piece_bytes = PIECE_BYTES if piece_bytes is None else piece_bytes
        self.pieces_in_flight = PIECES_IN_FLIGHT if pieces_in_flight is None else pieces_in_flight
        if self.piece_bytes < 1 or self.pieces_in_flight < 1:
            raise ValueError(
                f"piece_bytes and pieces_in_flight must be positive, got {self.piece_bytes} "
                f"and {self.pieces_in_flight}"
            )
        self._channels: dict[tuple[int, int, bool], _Channel] = {}
        self._busy: list[_Channel] = []  # channels with messages queued or pieces in flight
        self._abandoned: list[_Piece] = []  # pieces a timeout left to the inner transport: kept alive

    def shared_memory(self) -> SharedMemory | None:
        return None  # the shared-memory executor reads host memory only

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return self._post(buffer, dst, tag, True)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return self._post(buffer, src, tag, False)

    def _post(self, buffer: Any, peer: int, tag: int, sends: bool) -> _PostedMessage:
        message = _PostedMessage(buffer, self._device.is_device(buffer), self.piece_bytes)
        key = (peer, tag, sends)
        channel = self._channels.get(key)
        if channel is None:
            channel = self._channels[key] = _Channel(peer, tag, sends)
        if not channel.queue and not channel.flight:
            self._busy.append(channel)
        channel.queue.append(message)
        self._feed(channel)
        return message

    def waitall(self, requests: list[Request]) -> None:
        self.wait_for(requests, math.inf)

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            moved = self._progress()
            pending = [i for i, r in enumerate(requests) if not r.done]
            if not pending:
                return []
            now = time.monotonic()
            if now >= deadline:
                return pending
            if not moved:
                self._nap(min(_NAP_S, deadline - now))

    def _progress(self) -> bool:
        """Land what has arrived and post what may go, on every channel; whether anything moved."""
        moved = False
        for channel in list(self._busy):
            moved |= self._land(channel)
            moved |= self._feed(channel)
            if not channel.queue and not channel.flight:
                self._busy.remove(channel)
        return moved

    def _land(self, channel: _Channel) -> bool:
        """Finish the pieces of ``channel`` that have completed; whether any had."""
        landed = False
        if channel.sends:
            # sends may complete in any order: take every one that has
            for piece in list(channel.flight):
                if not self._inner.wait_for([piece.request], 0.0):
                    channel.flight.remove(piece)
                    self._finish(channel, piece)
                    landed = True
            return landed
        # receives land in the order they were posted (a loopback receive is matched when waited for)
        while channel.flight and not self._inner.wait_for([channel.flight[0].request], 0.0):
            self._finish(channel, channel.flight.popleft())
            landed = True
        return landed

    def _finish(self, channel: _Channel, piece: _Piece) -> None:
        message = piece.message
        if piece.host is not None:
            if not channel.sends:
                # the next piece is already on the wire while this one goes up to the device
                self._device.to_device(message.buffer[piece.lo : piece.hi], piece.host[: piece.hi - piece.lo])
            self.pool.release(piece.host)
            channel.pinned -= 1
        message.landed += 1
        if message.landed == len(message.ranges):
            message.done = True

    def _feed(self, channel: _Channel) -> bool:
        """Post the channel's next pieces in order while it has pinned buffers to spare; whether any went."""
        fed = False
        queue = channel.queue
        while queue:
            message = queue[0]
            lo, hi = message.ranges[message.posted]
            if message.device and hi > lo and channel.pinned >= self.pieces_in_flight:
                break
            channel.flight.append(self._piece(channel, message, lo, hi))
            fed = True
            message.posted += 1
            if message.posted == len(message.ranges):
                queue.popleft()
        return fed

    def _piece(self, channel: _Channel, message: _PostedMessage, lo: int, hi: int) -> _Piece:
        """Post one piece of ``message`` to the inner transport."""
        inner, peer, tag = self._inner, channel.peer, channel.tag
        host: Any = None
        if not message.device:
            view = message.buffer
        elif hi == lo:
            view = bytearray()  # an empty message needs no pinned buffer
        else:
            host = self.pool.acquire(hi - lo)
            channel.pinned += 1
            view = host[: hi - lo]
            if channel.sends:
                # after the stream's earlier work, so the piece holds the last reduction's result
                self._device.to_host(view, message.buffer[lo:hi])
        request = inner.isend(view, peer, tag) if channel.sends else inner.irecv(view, peer, tag)
        return _Piece(message, lo, hi, request, host)

    def _nap(self, seconds: float) -> None:
        """Nothing moved: block a little on the oldest receive in flight, or let the peers run."""
        for channel in self._busy:
            if not channel.sends and channel.flight:
                # once it lands (or the nap ends) the next round finishes it
                self._inner.wait_for([channel.flight[0].request], seconds)
                return
        os.sched_yield()

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        # the transport is not used again: give up every piece in flight, not only those of the
        # requests that timed out. The inner transport may still write or read their pinned
        # buffers, so they never go back to the pool, and stay referenced here
        flying = [piece for channel in self._busy for piece in channel.flight]
        in_pieces = [p.request for c in self._busy if not c.sends for p in c.flight]
        out_pieces = [p.request for c in self._busy if c.sends for p in c.flight]
        for piece in flying:
            if piece.host is not None:
                self.pool.forget(piece.host)
        self._abandoned.extend(flying)
        for channel in self._busy:
            channel.queue.clear()
            channel.flight.clear()
            channel.pinned = 0
        self._busy = []
        self._inner.abandon(in_pieces, out_pieces)

    def close(self, timeout: float = math.inf) -> None:
        """Free the pool's buffers; the inner transport is its owner's to close."""
        self.pool.clear()
