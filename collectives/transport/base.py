"""The point-to-point interface every transport implements."""

__all__ = ["NodeSplit", "Request", "SharedMemory", "Transport", "WrappedTransport"]

import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Request = Any
"""A transport's handle on a transfer in flight."""


class Transport(ABC):
    """Nonblocking sends and receives of bytes between the ranks of one group.

    Messages from one rank to another with the same tag arrive in the order
    they were sent, and receives are matched in the order they were posted,
    as in MPI. Buffers are those an :class:`~collectives.backends.ArrayBackend`
    gives from ``message()``; they must not be touched until the request completes.

    Attributes:
        FINDS_NODES_TOGETHER: whether :meth:`shared_memory` and :meth:`node_split`
            wait for every rank the first time (MPI's do, and cannot be bounded);
            then a collective meets the other ranks first, under its deadline.
        DUPLICATES: whether :meth:`duplicate` gives a transport (collective,
            unbounded in MPI, so the ranks meet first under a deadline).
    """

    FINDS_NODES_TOGETHER = False
    DUPLICATES = False

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

    def node_split(self) -> "NodeSplit | None":
        """This rank's node and rail, where the group spans several nodes of equal size; ``None`` otherwise.

        Collective the first time it is called. ``None`` (the default) also where
        all ranks share one node (see :meth:`shared_memory`).
        """
        return None

    def host_ranks(self) -> int:
        """How many of the group's ranks run on this rank's machine (by name); 1 unless the transport knows.

        More than its node's ranks where nodes are emulated on one machine, whose cores
        they then share. Collective the first time it is called.
        """
        return 1

    def node_local(self) -> bool:
        """Whether every rank of the group runs on this node; ``False`` unless the transport knows.

        Collective the first time it is called.
        """
        return False

    def cuda_aware(self) -> bool:
        """Whether the transport moves CUDA device buffers itself; ``False`` unless it says so."""
        return False

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        """Wait at most ``timeout`` seconds for ``requests``; the indices of those still pending.

        An empty list means every request completed. Pending requests stay
        valid and may be waited for again. This default waits without bound;
        transports that can stop waiting override it.
        """
        self.waitall(requests)
        return []

    def probe(self, tag: int, timeout: float) -> tuple[int, int] | None:
        """Wait at most ``timeout`` seconds for a message with ``tag`` from any rank, without receiving it.

        For servers that answer whoever asks, with messages of any size. Only one
        thread of a rank may probe and receive a given tag, so that the message
        probed is the one it then receives with :meth:`irecv` from that source.

        Returns:
            The message's source and size in bytes; ``None`` if none came in time.
        """
        raise NotImplementedError(f"{type(self).__name__} cannot probe")

    def take(self, tag: int) -> tuple[int, bytearray] | None:
        """The next message with ``tag`` from any rank, received, if one has arrived; never waits.

        Its source and bytes, or ``None``. This default probes, then receives what
        it found (so, as for :meth:`probe`, one thread of a rank at a time per tag);
        a transport with a matched probe takes exactly the message it probed.
        """
        found = self.probe(tag, 0.0)
        if found is None:
            return None
        src, nbytes = found
        buffer = bytearray(nbytes)
        self.waitall([self.irecv(buffer, src, tag)])  # probed: it has arrived
        return src, buffer

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:  # noqa: B027
        """Give up on requests a timeout left pending: cancel what can be, and let the process still end.

        The transport is not used afterwards. This default does nothing.
        """

    def drain_at_exit(self) -> None:  # noqa: B027 - transports whose sends end on their own
        """The communicator broke: at exit, take what peers still send, so their sends end and MPI can."""

    def duplicate(self) -> "Transport | None":
        """A transport over the same ranks whose messages never meet these (collective); ``None`` if none."""
        return None

    def close(self, timeout: float = math.inf) -> None:  # noqa: B027 - most transports have nothing to release
        """Release what the transport holds; it is not used afterwards.

        What is collective in it waits at most ``timeout`` seconds for the other ranks.
        """


class WrappedTransport(Transport):
    """A transport that runs over another, ``inner``: the same ranks, size and thread level.

    The watchdog's bounded transport and the device paths (staging, CUDA IPC) are such.
    """

    def __init__(self, inner: Transport) -> None:
        self._inner = inner

    @property
    def rank(self) -> int:
        return self._inner.rank

    @property
    def size(self) -> int:
        return self._inner.size

    @property
    def thread_level(self) -> str:
        return self._inner.thread_level


class SharedMemory(ABC):
    """Memory that every rank of a group maps, each owning a region of it, and a barrier.

    Offered by a transport whose ranks all share one node (see
    :meth:`Transport.shared_memory`); the shared-memory executor reads and writes
    peers' regions directly instead of sending messages.

    The barrier is split in two so that a wait can be bounded and resumed:
    :meth:`arrive` once, then :meth:`wait` until it returns no pending ranks. With
    its arrival a rank may leave a short note (a few integers) that every rank can
    read after the barrier, e.g. where its data lies.
    """

    NOTE_INTS = 6
    """Integers a note may hold."""

    MESSAGE_BYTES = 0
    """Bytes of the message a rank may post for the next barrier (:meth:`post`); 0 where it cannot."""

    @property
    @abstractmethod
    def region_bytes(self) -> int:
        """Bytes of each rank's region."""

    @abstractmethod
    def region(self, rank: int) -> memoryview:
        """Rank ``rank``'s region, writable by every rank, as bytes."""

    @abstractmethod
    def arrive(self, note: Sequence[int] = ()) -> None:
        """Arrive at the next barrier, leaving ``note``; stores before it are seen by all ranks after it."""

    @abstractmethod
    def wait(self, timeout: float = math.inf) -> list[int]:
        """Wait at most ``timeout`` seconds for every rank to arrive; the ranks still missing.

        Empty means the barrier is passed. Call again to go on waiting.
        """

    @abstractmethod
    def note(self, rank: int) -> tuple[int, ...]:
        """The note ``rank`` left at the last barrier passed (:data:`NOTE_INTS` integers, zeros unset).

        Read it before arriving at the next barrier: a rank may already be leaving
        the note of that one. A barrier passed without a note leaves it unspecified.
        """

    def post(self, message: bytes | bytearray | memoryview) -> None:
        """Leave ``message`` (at most :data:`MESSAGE_BYTES`) for every rank to read after the next barrier.

        Post before arriving; a call agrees on its signature this way.
        """
        raise NotImplementedError(f"{type(self).__name__} carries no messages")

    def post_signature(self, packed: bytearray, digest: int, sequence: int) -> None:
        """:meth:`post` a call's packed signature, whose first 8 bytes are its ``sequence`` number.

        ``digest`` (a nonzero int64) stands for the rest of it: a memory may leave
        that rest in place where the same digest was posted before, and compare
        digests in :meth:`signatures_match`.
        """
        self.post(packed)

    def signatures_match(self, packed: bytearray, digest: int, sequence: int) -> bool:
        """Whether every other rank posted the signature this rank did (:meth:`post_signature`).

        Read after the barrier passed. ``False`` means "compare the whole
        signatures" (a rank may have posted its call's with :meth:`post`), which is
        all a memory without digests can say.
        """
        return False

    def pass_signed(self, packed: bytearray, digest: int, sequence: int, timeout: float) -> bool | None:
        """:meth:`post_signature`, :meth:`arrive` (no note) and :meth:`wait` up to ``timeout``, in one call.

        Returns:
            ``None`` where ranks are still missing (go on with :meth:`wait`, then
            :meth:`signatures_match`); else what :meth:`signatures_match` says.
        """
        self.post_signature(packed, digest, sequence)
        self.arrive()
        if self.wait(timeout):
            return None
        return self.signatures_match(packed, digest, sequence)

    def small_kernel(
        self,
        halves: tuple[Sequence[Any], ...],
        dtype: str,
        op: str,
        count: int,
        spin_s: float,
        mode: int = 0,
        share: tuple[int, int] | None = None,
        root: int = 0,
    ) -> Any:
        """The compiled engine's repeated small allreduce over ``halves``, or ``None`` where it takes none.

        ``halves``: per turn, every rank's small region (as arrays of ``count``
        elements of ``dtype``); ``op``: the binary op's name. Its
        ``run(turn, work, source, sequence, packed, digest)`` is
        :meth:`pass_signed` (no signature where ``digest`` is 0) with the copy of
        ``source`` into this rank's region of ``turn`` before and the reduction of
        every rank's into ``work`` after, in one call; it returns 0 (done), 1 (ranks
        still missing after ``spin_s``: go on with :meth:`wait`) or 2 (the
        signatures differ); after 1 or 2, ``reduce(turn, work)`` reduces. ``mode`` 1
        reduces elements ``share`` (lo, hi) of the regions alone into ``work`` (a
        reduce-scatter's), 2 copies every rank's region into ``work`` in rank order
        (an all-gather's; of no bytes, a barrier's), 3 copies ``root``'s region into ``work``
        (a broadcast's: only the root copies in), 4 reduces every rank's into ``work`` at
        ``root`` alone (a reduce's). Memories without the control words the engine reads take none.
        """
        return None

    def segmented_kernel(
        self,
        halves: Sequence[Sequence[Any]],
        dtype: str,
        op: str,
        bounds: Sequence[int],
        slot: int,
        spin_s: float,
    ) -> Any:
        """The compiled engine's repeated allreduce through the window, segment by segment, or ``None``.

        ``halves``: per half, every rank's half of its region (bytes); ``bounds``:
        where each owner's share starts, then the count; ``slot``: elements of a
        share per segment. Its ``run(turn, work, source, sequence, packed, digest)``
        is ``SharedExecutor.allreduce``'s window path, barrier for barrier (the first
        with the signature and the note of that path); it returns 0 (done), 1 (ranks
        still missing after ``spin_s``: wait on, then ``resume(work, source)``), 2
        (the signatures differ) or 4 (the first barrier's notes differ). Memories
        without the control words the engine reads take none.
        """
        return None

    def message(self, rank: int) -> memoryview:
        """What ``rank`` posted for the last barrier passed (:data:`MESSAGE_BYTES` bytes).

        Read it before arriving at the next barrier, as a note.
        """
        raise NotImplementedError(f"{type(self).__name__} carries no messages")

    def allocate(self, nbytes: int) -> list[memoryview]:
        """A new shared allocation of ``nbytes`` per rank: every rank's part, as bytes; collective.

        It lives as long as the shared memory (until the transport is closed).
        """
        raise NotImplementedError(f"{type(self).__name__} cannot allocate")

    def abandon(self) -> None:  # noqa: B027 - nothing to do where the process can end on its own
        """Give up on a barrier a timeout left unpassed; the process must still be able to end."""

    def break_off(self, rank: int) -> None:  # noqa: B027 - memories that cannot tell the others say nothing
        """Tell the other ranks that this rank will pass no more barriers, as ``rank`` broke the communicator.

        Their waits return at once, and :meth:`broken_by` says ``rank``.
        """

    def broken_by(self) -> int | None:
        """The rank named by the first other rank that called :meth:`break_off`, if any did."""
        return None

    def time_out(self) -> None:  # noqa: B027 - memories that cannot tell the others say nothing
        """Mark that this rank's call timed out: no wait ends on it; a late rank's call looks at its end."""

    def timed_out_by(self) -> int | None:
        """The first other rank that called :meth:`time_out` (and broke off no more), if any did."""
        return None

    def barrier(self) -> None:
        """Return once every rank has called it, waiting without bound."""
        self.arrive()
        self.wait()


@dataclass(frozen=True)
class NodeSplit:
    """A group spread over several nodes, each of the same number of ranks, from one rank's view.

    Attributes:
        shared: the memory of this rank's node, over its ranks in group order.
        node_ranks: the group ranks of this node's ranks, in that order.
        rail: a transport over the ranks of every node with this rank's local rank,
            one per node, in group order.
        rail_ranks: the group ranks of the rail's ranks, in that order.
    """

    shared: SharedMemory
    node_ranks: tuple[int, ...]
    rail: Transport
    rail_ranks: tuple[int, ...]
