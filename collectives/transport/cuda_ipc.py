"""Device messages between the ranks of one node, copied device-to-device into each peer's mailbox."""

__all__ = ["DEFAULT_SLOTS", "DEFAULT_SLOT_BYTES", "CudaIpcTransport"]

import math
import os
import struct
import time
from collections import deque
from typing import Any

import numpy as np

from ..errors import CollectiveTimeout, TransportError
from .base import Request, Transport, WrappedTransport
from .device import IPC_HANDLE_BYTES, GpuDevice
from .tags import Tag

DEFAULT_SLOT_BYTES = 1 << 22
"""Bytes of one slot of a mailbox: larger messages go in pieces of this size."""

DEFAULT_SLOTS = 2
"""Slots per sender in each mailbox, so that one piece is copied in while the last is copied out."""

_PIECE = struct.Struct("<q")

_CLOSE_TIMEOUT_S = 30.0


class _Send:
    __slots__ = ("buffer", "done", "offset", "peer", "pieces")

    def __init__(self, buffer: Any, peer: int) -> None:
        self.buffer = buffer
        self.peer = peer
        self.offset = 0
        self.pieces = 0
        self.done = False


class _Recv(_Send):
    __slots__ = ()


class _Host:
    """A host message passed to the inner transport as it is."""

    __slots__ = ("done", "request")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.done = False


class _Peer:
    """This rank's dealings with one peer: its mailbox, the pieces in each direction, the credits."""

    def __init__(self, mailbox: Any, slots: int) -> None:
        self.mailbox = mailbox  # the peer's mailbox, mapped here
        self.sends: deque[_Send] = deque()
        self.recvs: deque[_Recv] = deque()
        self.sent = 0  # pieces sent to the peer, ever
        self.received = 0  # pieces received from the peer, ever
        self.credits = slots  # the peer's slots for this rank that are free
        self.credit_buffer = bytearray(_PIECE.size)
        self.credit_request: Request = None  # a receive of the next credit, while one is owed
        self.ready_buffer = bytearray(_PIECE.size)
        self.ready_request: Request = None  # a receive of the next piece's length, while one is awaited


class CudaIpcTransport(WrappedTransport):
    """A transport for device buffers between ranks of one node, over CUDA IPC.

    Every rank allocates one device mailbox when the transport is made, with
    ``slots`` slots of ``slot_bytes`` for each sender, and the ranks map each
    other's mailboxes once, by their IPC handles. A message goes in pieces of at
    most ``slot_bytes``: the sender copies a piece device-to-device into its slot
    in the receiver's mailbox and tells the receiver its length in a tiny host
    message; the receiver copies it out into the receive buffer and gives the slot
    back with another. A sender writes a slot only once it is given back, so
    nothing is overwritten early. Host buffers pass to the inner transport as they are.
    Device messages between two ranks are matched in the order they were posted,
    whatever their tags (the executor sends all its messages under one tag).

    Transfers move while the executor waits (:meth:`waitall`, :meth:`wait_for`),
    each wait advancing every message in flight, as MPI's progress does.

    Make one with :meth:`connect`, which is collective.
    """

    def __init__(
        self, inner: Transport, device: GpuDevice, mailbox: Any, peers: list[Any], slot_bytes: int, slots: int
    ) -> None:
        super().__init__(inner)
        self._device = device
        self._mailbox = mailbox
        self._slot_bytes = slot_bytes
        self._slots = slots
        self._peers = [_Peer(m, slots) for m in peers]
        self._control: list[Request] = []  # host sends of lengths and credits, until they complete
        self._pending = 0  # device sends and receives not yet done
        self._closed = False

    @classmethod
    def connect(
        cls,
        inner: Transport,
        device: GpuDevice,
        *,
        slot_bytes: int = DEFAULT_SLOT_BYTES,
        slots: int = DEFAULT_SLOTS,
        timeout: float = 60.0,
    ) -> "CudaIpcTransport | None":
        """Allocate this rank's mailbox and map every peer's; ``None`` on every rank if any rank cannot.

        Collective over ``inner``'s ranks, which must all be on one node.

        Args:
            inner: the host transport of the ranks.
            device: the device the ranks' buffers are on.
            slot_bytes: bytes of a slot (the largest piece).
            slots: slots per sender in a mailbox.
            timeout: seconds to wait for the peers' handles.
        """
        size, rank = inner.size, inner.rank
        if slot_bytes < 1 or slots < 1:
            raise ValueError(f"slot_bytes and slots must be positive, got {slot_bytes} and {slots}")
        mailbox = device.allocate(size * slots * slot_bytes)
        handle = device.ipc_handle(mailbox)
        handles = [bytearray(IPC_HANDLE_BYTES) for _ in range(size)]
        _exchange(inner, handle, handles, timeout)
        peers: list[Any] = [None] * size
        ok = True
        for peer in range(size):
            if peer == rank:
                peers[peer] = mailbox  # never written through: a rank sends nothing to itself
                continue
            try:
                peers[peer] = device.open_ipc(bytes(handles[peer]), size * slots * slot_bytes)
            except Exception:  # the CUDA error of one rank; the verdict is agreed below
                ok = False
        verdicts = [bytearray(1) for _ in range(size)]
        _exchange(inner, bytes([ok]), verdicts, timeout)
        if all(v[0] for v in verdicts):
            return cls(inner, device, mailbox, peers, slot_bytes, slots)
        for peer, mapped in enumerate(peers):
            if peer != rank and mapped is not None:
                device.close_ipc(mapped)
        return None

    def node_local(self) -> bool:
        return True

    @property
    def slot_bytes(self) -> int:
        """Bytes of one slot: the largest piece of a message."""
        return self._slot_bytes

    @property
    def slots(self) -> int:
        """Slots per sender in each mailbox: the pieces from one rank to another in flight at once."""
        return self._slots

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        if not self._device.is_device(buffer):
            return _Host(self._inner.isend(buffer, dst, tag))
        self._check_peer(dst)
        send = _Send(buffer, dst)
        self._peers[dst].sends.append(send)
        self._pending += 1
        self._progress()
        return send

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        if not self._device.is_device(buffer):
            return _Host(self._inner.irecv(buffer, src, tag))
        self._check_peer(src)
        recv = _Recv(buffer, src)
        self._peers[src].recvs.append(recv)
        self._pending += 1
        self._progress()
        return recv

    def waitall(self, requests: list[Request]) -> None:
        self.wait_for(requests, math.inf)

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        deadline = time.monotonic() + timeout
        while True:
            self._progress()
            hosts = [i for i, r in enumerate(requests) if isinstance(r, _Host) and not r.done]
            if hosts:
                left = self._inner.wait_for([requests[i].request for i in hosts], 0.0)
                waiting = {hosts[j] for j in left}
                for i in hosts:
                    requests[i].done = i not in waiting
            pending = [i for i, r in enumerate(requests) if not r.done]
            if not pending or time.monotonic() >= deadline:
                return pending
            os.sched_yield()

    def _progress(self) -> None:
        """Advance every message in flight as far as it goes without waiting."""
        if self._control:
            left = self._inner.wait_for(self._control, 0.0)
            self._control = [self._control[i] for i in left]
        if not self._pending:
            return
        for peer_rank, peer in enumerate(self._peers):
            if peer.sends:
                self._send_pieces(peer_rank, peer)
            if peer.recvs:
                self._receive_pieces(peer_rank, peer)

    def _slot(self, mailbox: Any, sender: int, piece: int) -> Any:
        start = (sender * self._slots + piece % self._slots) * self._slot_bytes
        return mailbox[start : start + self._slot_bytes]

    def _send_pieces(self, peer_rank: int, peer: _Peer) -> None:
        self._take_credits(peer_rank, peer)
        while peer.sends and peer.credits > 0:
            send = peer.sends[0]
            length = min(len(send.buffer) - send.offset, self._slot_bytes)
            slot = self._slot(peer.mailbox, self.rank, peer.sent)
            self._device.copy(slot[:length], send.buffer[send.offset : send.offset + length])
            # the piece must be in the peer's memory before the peer hears of it
            self._device.synchronize()
            self._control.append(self._inner.isend(_PIECE.pack(length), peer_rank, Tag.IPC_READY))
            peer.sent += 1
            peer.credits -= 1
            send.offset += length
            send.pieces += 1
            if send.offset == len(send.buffer):
                send.done = True
                peer.sends.popleft()
                self._pending -= 1
            self._take_credits(peer_rank, peer)

    def _take_credits(self, peer_rank: int, peer: _Peer) -> None:
        """Count the credits the peer has sent, and keep a receive posted for the next one owed."""
        while peer.credits < self._slots:
            if peer.credit_request is None:
                peer.credit_request = self._inner.irecv(peer.credit_buffer, peer_rank, Tag.IPC_CREDIT)
            if self._inner.wait_for([peer.credit_request], 0.0):
                return
            peer.credit_request = None
            peer.credits += 1

    def _receive_pieces(self, peer_rank: int, peer: _Peer) -> None:
        while peer.recvs:
            if peer.ready_request is None:
                peer.ready_request = self._inner.irecv(peer.ready_buffer, peer_rank, Tag.IPC_READY)
            if self._inner.wait_for([peer.ready_request], 0.0):
                return
            peer.ready_request = None
            (length,) = _PIECE.unpack(peer.ready_buffer)
            recv = peer.recvs[0]
            if length > len(recv.buffer) - recv.offset:
                raise TransportError(
                    f"rank {self.rank} expected {len(recv.buffer) - recv.offset} more bytes from rank "
                    f"{peer_rank}, got a piece of {length}"
                )
            slot = self._slot(self._mailbox, peer_rank, peer.received)
            self._device.copy(recv.buffer[recv.offset : recv.offset + length], slot[:length])
            # the copy must be done before the sender may overwrite the slot
            self._device.synchronize()
            self._control.append(self._inner.isend(_PIECE.pack(1), peer_rank, Tag.IPC_CREDIT))
            peer.received += 1
            recv.offset += length
            recv.pieces += 1
            if recv.offset == len(recv.buffer):
                recv.done = True
                peer.recvs.popleft()
                self._pending -= 1

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        # pieces in flight cannot be called back; stop posting, and cancel the host messages
        hosts_in = [r.request for r in receives if isinstance(r, _Host)]
        hosts_out = [r.request for r in sends if isinstance(r, _Host)]
        waiting = [p.ready_request for p in self._peers if p.ready_request is not None]
        waiting += [p.credit_request for p in self._peers if p.credit_request is not None]
        self._inner.abandon(hosts_in + waiting, hosts_out + self._control)
        for peer in self._peers:
            peer.sends.clear()
            peer.recvs.clear()
            peer.ready_request = peer.credit_request = None
        self._control = []
        self._pending = 0
        self._closed = True  # its counters no longer match the peers'

    def close(self, timeout: float = math.inf) -> None:
        """Wait for credits owed, unmap the peers' mailboxes, free this rank's once unmapped; collective."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + _CLOSE_TIMEOUT_S
        while any(p.credits < self._slots for p in self._peers) or self._control:
            self._progress()
            for rank, peer in enumerate(self._peers):
                self._take_credits(rank, peer)
            if time.monotonic() >= deadline:
                raise CollectiveTimeout(f"rank {self.rank}: peers did not return their mailbox slots")
            os.sched_yield()
        for rank, peer in enumerate(self._peers):
            if rank != self.rank:
                self._device.close_ipc(peer.mailbox)
        # a rank frees its mailbox only once no peer maps it
        _exchange(
            self._inner, b"\x01", [bytearray(1) for _ in range(self.size)], _CLOSE_TIMEOUT_S, Tag.IPC_CLOSE
        )
        self._peers = []
        self._mailbox = None

    def _check_peer(self, peer: int) -> None:
        if not 0 <= peer < self.size or peer == self.rank:
            raise TransportError(f"rank {self.rank} cannot send device messages to rank {peer}")


def _exchange(
    inner: Transport, mine: bytes, theirs: list[bytearray], timeout: float, tag: int = Tag.IPC_SETUP
) -> None:
    """Send ``mine`` to every peer, receive each peer's into ``theirs[peer]``; ``theirs[rank]`` = mine."""
    rank, size = inner.rank, inner.size
    payload = np.frombuffer(mine, dtype=np.uint8).copy()
    requests = [inner.irecv(theirs[p], p, tag) for p in range(size) if p != rank]
    requests += [inner.isend(payload, p, tag) for p in range(size) if p != rank]
    if inner.wait_for(requests, timeout):
        raise CollectiveTimeout(
            f"rank {rank}: the peers did not answer in {timeout:g} s while setting up CUDA IPC"
        )
    theirs[rank][:] = mine
