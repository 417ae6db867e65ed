"""The ranks' agreement on a call: its packed signature (a guard) and the exchange and comparison of them."""

__all__ = ["FUSED_BYTES", "Agreement", "PackedSignature"]

import hashlib
import struct
from collections.abc import Callable
from dataclasses import replace

from .call import Call, Posted, Tracked
from .signature import SIGNATURE_BYTES, Signature, disagreement, stamp_tag
from .transport.base import SharedMemory, Transport
from .transport.tags import Tag

_SIGNATURE = Tag.SIGNATURE  # a module global: read by every call's exchange

FUSED_BYTES = 4096
"""The most data bytes that may travel to one peer with a call's signature (see :class:`PackedSignature`)."""

_SEQUENCE = struct.Struct("<q")  # a packed signature starts with its sequence number


def _digest(packed: bytearray) -> int:
    """A nonzero int64 for all of a packed signature but its sequence number (see ``post_signature``)."""
    word = int.from_bytes(
        hashlib.blake2b(packed[_SEQUENCE.size :], digest_size=8).digest(), "little", signed=True
    )
    return word or 1


def _nothing() -> None:
    """What a mismatch does before its error unless told otherwise."""


class PackedSignature:
    """What every call of one kind on a communicator agrees on, packed once and reused.

    The ranks exchange :attr:`packed` with the call's sequence number written in
    front, so a repeated call packs nothing anew. A small call's first messages may
    travel with it: the signature message to a peer in :attr:`outgoing` carries the
    data after the signature, and the peer finds it with :meth:`Agreement.arrived`
    (the watchdog's ``arrived``).

    Attributes:
        signature: the call's signature, its sequence number 0.
        packed: the packed signature, sent by one call at a time.
        digest: a nonzero int64 standing for ``packed`` but its sequence number.
        outgoing: per peer, the data that travels with the signature (after it).
    """

    __slots__ = ("_messages", "_tag", "digest", "outgoing", "packed", "signature")

    def __init__(self, signature: Signature, payloads: dict[int, int] | None = None) -> None:
        self.signature = signature
        self.packed = bytearray(signature.pack())
        self._tag = signature.tag
        self.digest = _digest(self.packed)
        payloads = payloads or {}
        if any(size > FUSED_BYTES for size in payloads.values()):
            raise ValueError(f"at most {FUSED_BYTES} bytes travel with a signature; got {payloads}")
        self._messages = {peer: bytearray(SIGNATURE_BYTES + size) for peer, size in payloads.items()}
        self.outgoing = {peer: memoryview(m)[SIGNATURE_BYTES:] for peer, m in self._messages.items()}

    def message(self, peer: int) -> bytearray:
        """What goes to ``peer``: the signature, then any data for it."""
        return self._messages.get(peer, self.packed)

    def stamp(self, sequence: int, tag: bytes = b"") -> None:
        """Write the call's sequence number and tag (see :attr:`Watchdog.tag`) into every message."""
        _SEQUENCE.pack_into(self.packed, 0, sequence)
        if tag != self._tag:  # a guard kept for repeated calls may serve calls of several tags
            stamp_tag(self.packed, tag)
            self._tag = tag
            self.digest = _digest(self.packed)
        if self._messages:
            for message in self._messages.values():
                message[:SIGNATURE_BYTES] = self.packed


class Agreement:
    """One communicator's signature checks: the exchange by messages, and the comparison after a barrier.

    The buffers and peers are the same for every call, made once. The watchdog
    keeps the bound methods (``exchange``, ``compare_posted``, ``arrived``) as its
    own attributes, so a call pays no extra lookup for them.

    Attributes:
        on_mismatch: runs on a rank whose barrier found the signatures different, before the error.
        received: per rank, the last signature message from it, with room for data after it.
    """

    __slots__ = ("_heads", "_peers", "_rank", "_size", "_tracked", "_transport", "on_mismatch", "received")

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._rank, self._size = transport.rank, transport.size
        self._peers = [peer for peer in range(self._size) if peer != self._rank]
        self._tracked = [Tracked(None, peer, False) for peer in self._peers]
        self._tracked += [Tracked(None, peer, True) for peer in self._peers]
        # room for any data a peer's message may carry, so none is ever truncated
        self.received = [bytearray(SIGNATURE_BYTES + FUSED_BYTES) for _ in range(self._size)]
        self._heads = [memoryview(r)[:SIGNATURE_BYTES] for r in self.received]
        self.on_mismatch: Callable[[], None] = _nothing

    def arrived(self, peer: int, size: int) -> memoryview:
        """The ``size`` data bytes that came with the last signature from ``peer`` (see `PackedSignature`)."""
        return memoryview(self.received[peer])[SIGNATURE_BYTES : SIGNATURE_BYTES + size]

    def exchange(self, call: Call, guard: PackedSignature, sequence: int) -> None:
        """Exchange ``guard``'s stamped messages with every other rank; raise on every rank if any differ."""
        transport = self._transport
        mine = guard.packed
        received = self.received
        requests = [transport.irecv(received[peer], peer, _SIGNATURE) for peer in self._peers]
        requests += [transport.isend(guard.message(peer), peer, _SIGNATURE) for peer in self._peers]
        call.wait(requests, "signature", self._tracked)
        heads = self._heads
        for peer in self._peers:
            if heads[peer].tobytes() != mine:  # as bytes: see compare_posted
                break
        else:
            return
        heads[self._rank][:] = mine
        signature = replace(guard.signature, sequence=sequence)
        error = disagreement(signature, [bytes(head) for head in heads], self._rank)
        if error is not None:
            raise error

    def compare_posted(self, shared: SharedMemory, guard: Posted, sequence: int) -> None:
        """After a barrier that carried signatures: raise on every rank if any differ."""
        mine = guard.packed
        for peer in self._peers:
            # as bytes: a memoryview compares element by element, three times slower
            if shared.message(peer)[:SIGNATURE_BYTES].tobytes() != mine:
                break
        else:
            return
        heads = [bytes(shared.message(r)[:SIGNATURE_BYTES]) for r in range(self._size)]
        error = disagreement(replace(guard.signature, sequence=sequence), heads, self._rank)
        if error is not None:
            self.on_mismatch()
            raise error
