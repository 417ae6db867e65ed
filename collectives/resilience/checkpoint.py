"""In-memory checkpoints, Rabit style: each rank's state kept at home and on the next ranks of the ring."""

__all__ = ["CheckpointError", "Checkpointer", "holders_of"]

from typing import TYPE_CHECKING, Any

import numpy as np

from ..api import allgather
from ..call import Tracked
from ..communicator import Communicator, communicator_of
from ..errors import CheckpointError, ConfigurationError
from ..faults import CHECKPOINT
from ..faults import PLAN as _FAULTS
from ..transport.tags import Tag
from .serial import dumps, loads

if TYPE_CHECKING:
    from mpi4py import MPI


def _fitting(buffer: np.ndarray | None, nbytes: int) -> np.ndarray:
    """The first ``nbytes`` of ``buffer`` where it is that large, else new memory."""
    return buffer[:nbytes] if buffer is not None and buffer.nbytes >= nbytes else np.empty(nbytes, np.uint8)


def holders_of(rank: int, size: int, replicas: int) -> tuple[int, ...]:
    """The ranks that keep a copy of ``rank``'s state: the next ``replicas`` ranks around the ring."""
    return tuple((rank + j) % size for j in range(1, replicas + 1))


class Checkpointer:
    """Checkpoints of every rank's state in memory, with copies on the next ranks of the ring.

    :meth:`checkpoint` is collective: every rank passes its own state (any
    picklable object: a dict of numpy arrays or torch tensors, a model's
    ``state_dict``, numbers), keeps it, and sends a copy to each of the next
    ``replicas`` ranks (rank ``r``'s copies live on ``r + 1, ..., r + replicas``,
    modulo the world size), receiving the copies of the previous ones. The ranks
    agree on the version first, so every rank's version ``v`` is of the same
    call; a rank whose version differs raises on every rank. Loss of up to
    ``replicas`` consecutive ranks leaves a copy of each lost state on a
    survivor (:meth:`replica_of`).

    The state is pickled when taken (numpy arrays' memory copied once, out of
    band: see :mod:`.serial`): later changes to the objects passed do not reach
    the checkpoint. Pickle, unlike the files of :func:`~collectives.resilience.save`,
    as these bytes never come from a file: they are made by this job's ranks and
    travel only between them (as the job's other messages do), and any picklable
    state stays allowed; unpickling what a peer of the same job made runs no code
    the job did not already trust. Two collectives of the communicator carry it
    (the sizes and versions, then the copies), under its watchdog: a rank that
    dies or never comes makes the others raise within the timeout, naming it.

    Args:
        comm: the communicator (or mpi4py communicator); the default one when ``None``.
        replicas: copies of each rank's state kept on other ranks; at most the
            world size - 1 (fewer are kept on smaller worlds).
        version: the version of the last checkpoint, to go on numbering after a
            restart (0: none yet).

    Attributes:
        version: the version of the last checkpoint every rank took, 0 before the first.
        replicas: copies of each state kept on other ranks.
    """

    def __init__(
        self, comm: "Communicator | MPI.Comm | None" = None, *, replicas: int = 1, version: int = 0
    ) -> None:
        if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
            raise ConfigurationError(f"replicas must be a non-negative integer, got {replicas!r}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise ConfigurationError(f"version must be a non-negative integer, got {version!r}")
        self.comm = communicator_of(comm)
        self.replicas = min(replicas, self.comm.size - 1)
        self.version = version
        self._held: dict[int, bytes | np.ndarray] = {}  # rank -> its state's bytes at self.version
        self._previous: dict[int, bytes | np.ndarray] = {}  # the version before, until the next begins

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    def checkpoint(self, state: Any) -> int:
        """Keep ``state`` as this rank's, with copies on the next ranks; collective. The new version.

        Raises:
            CheckpointError: the ranks' versions differ (on every rank), or ``state`` does not pickle.
            CollectiveTimeout, PeerFailedError: a rank died or never came (the communicator is unusable).
        """
        comm = self.comm
        rank, size = comm.rank, comm.size
        # the version before last's buffers take this one: no new memory (and its page faults) each
        # step; the version before is lost with them, even if this checkpoint fails
        spare = {r: b for r, b in self._previous.items() if isinstance(b, np.ndarray)}
        self._previous = {}
        data: np.ndarray | None = None
        failure: Exception | None = None
        try:
            data = dumps(state, into=spare.pop(rank, None))
        except Exception as error:
            failure = error
        mine = -1 if data is None else len(data)  # -1: the others raise too, naming this rank
        info = allgather(np.array([mine, self.version], np.int64), comm=comm).reshape(size, 2)
        unpickled = [r for r, n in enumerate(info[:, 0]) if n < 0]
        if unpickled:
            raise CheckpointError(
                f"rank {rank}: the state of rank{'s' if len(unpickled) > 1 else ''} "
                f"{', '.join(map(str, unpickled))} does not pickle"
                + ("" if failure is None else f": {failure}")
            ) from failure
        assert data is not None  # its size went to the others
        versions = [int(v) for v in info[:, 1]]
        if len(set(versions)) > 1:
            raise CheckpointError(
                f"rank {rank}: the ranks' checkpoint versions differ: "
                + ", ".join(f"rank {r} at {v}" for r, v in enumerate(versions))
            )
        sizes = [int(n) for n in info[:, 0]]
        received = self._exchange(data, sizes, spare)
        self.version += 1
        self._previous, self._held = self._held, {rank: data, **received}
        return self.version

    def roll_back(self) -> int:
        """Go back to the version before the last, kept until the next checkpoint begins; that version.

        Not collective. For ranks that finished a checkpoint that others did not
        (a rank died while the copies travelled): all go back to the version every
        survivor holds.

        Raises:
            CheckpointError: no earlier version is kept (none taken, or a checkpoint began since).
        """
        if not self._previous:
            raise CheckpointError(
                f"rank {self.comm.rank} keeps no version before {self.version} (a checkpoint began since)"
            )
        self._held, self._previous = self._previous, {}
        self.version -= 1
        return self.version

    def _exchange(
        self, data: np.ndarray, sizes: list[int], spare: dict[int, np.ndarray]
    ) -> dict[int, np.ndarray]:
        """Send ``data`` to this rank's holders, receive the states it holds; one watched call."""
        comm = self.comm
        rank, size, replicas = comm.rank, comm.size, self.replicas
        what = f"checkpoint version {self.version + 1}"
        if replicas == 0:
            if _FAULTS.armed:
                _FAULTS.reached(rank, what, CHECKPOINT)
            return {}
        sources = [(rank - j) % size for j in range(1, replicas + 1)]
        buffers = {src: _fitting(spare.get(src), sizes[src]) for src in sources}
        mine = data
        watchdog = comm.watchdog
        guard = watchdog.signature_of("checkpoint", f"ring(replicas={replicas})", sum(sizes), "uint8")
        transport = comm.transport
        with watchdog.watch(guard) as call:
            if _FAULTS.armed:  # sizes agreed, no copy sent: a checkpoint cut off mid-way
                _FAULTS.reached(rank, what, CHECKPOINT)
            requests = [transport.irecv(buffers[src], src, Tag.DATA) for src in sources]
            peers = [Tracked(None, src, False) for src in sources]
            for dst in holders_of(rank, size, replicas):
                requests.append(transport.isend(mine, dst, Tag.DATA))
                peers.append(Tracked(None, dst, True))
            call.wait(requests, "checkpoint copies", peers, transport)
        return buffers  # kept as received: no copy

    def load(self) -> Any:
        """This rank's state of the last checkpoint (a new copy each call); ``None`` before the first."""
        data = self._held.get(self.comm.rank)
        return None if data is None else loads(data)

    @property
    def held(self) -> tuple[int, ...]:
        """The ranks whose state of the last checkpoint this rank keeps (its own first)."""
        return tuple(self._held)

    def holders_of(self, rank: int) -> tuple[int, ...]:
        """The ranks that keep a copy of ``rank``'s state."""
        return holders_of(rank, self.comm.size, self.replicas)

    def replica_bytes(self, rank: int) -> bytes:
        """``rank``'s state of the last checkpoint as bytes (:mod:`.serial`'s), as kept here.

        Raises:
            CheckpointError: this rank keeps no copy of ``rank``'s state.
        """
        return bytes(self._kept(rank))

    def replica_of(self, rank: int) -> Any:
        """``rank``'s state of the last checkpoint, from the copy this rank keeps (e.g. of a lost rank).

        Raises:
            CheckpointError: this rank keeps no copy of ``rank``'s state.
        """
        return loads(self._kept(rank))

    def _kept(self, rank: int) -> "bytes | np.ndarray":
        data = self._held.get(rank)
        if data is None:
            holders = ", ".join(map(str, self.holders_of(rank))) or "no rank"
            raise CheckpointError(
                f"rank {self.comm.rank} keeps no copy of rank {rank}'s state "
                f"(version {self.version}; its copies are on {holders})"
            )
        return data

    def adopt(self, rank: int, data: bytes) -> None:
        """Keep ``data`` (from :meth:`replica_bytes`) as ``rank``'s state of this version.

        For a replacement rank taking over a lost rank's state before the next checkpoint.
        """
        self._held[rank] = bytes(data)

    def __repr__(self) -> str:
        return (
            f"Checkpointer(rank={self.comm.rank}, size={self.comm.size}, replicas={self.replicas}, "
            f"version={self.version}, held={list(self._held)})"
        )
