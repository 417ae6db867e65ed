"""Surviving a rank's death under MPI with fault tolerance (ULFM): shrink, go on, restore its state."""

__all__ = [
    "Recovery",
    "Shrunk",
    "adopter_of",
    "fault_tolerance_missing",
    "grow",
    "hung_ranks",
    "join",
    "join_grown",
    "recover",
    "replace",
    "require_fault_tolerance",
    "shrink",
]

import contextlib
import os
import signal
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .. import communicator as _communicator
from ..api import allgather, broadcast
from ..communicator import Communicator, communicator_of
from ..errors import BrokenCommunicatorError, CollectiveTimeout, ConfigurationError
from .checkpoint import Checkpointer, CheckpointError, holders_of

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..transport.mpi import MPITransport


def fault_tolerance_missing() -> str | None:
    """``None`` where the survivors of a dead rank can go on (Open MPI 5, ``--with-ft ulfm``), else why not.

    Never collective; the checkpoints (in memory, in a directory) work either way.
    """
    from ..transport.mpi import ulfm_missing

    return ulfm_missing()


def require_fault_tolerance() -> None:
    """Raise :class:`~collectives.ConfigurationError` saying why, where the MPI cannot survive a death."""
    reason = fault_tolerance_missing()
    if reason is not None:
        raise ConfigurationError(f"cannot survive a rank's death: {reason}")


@dataclass(frozen=True)
class Shrunk:
    """The communicator over the ranks that survived, and who is gone.

    Attributes:
        communicator: the new communicator over the survivors, in their old order
            (every collective of the library works on it).
        lost: the ranks of the old communicator that died.
        survivors: for each rank of the new communicator, its rank in the old one.
    """

    communicator: Communicator
    lost: tuple[int, ...]
    survivors: tuple[int, ...]


def hung_ranks(error: BaseException) -> tuple[int, ...]:
    """The ranks ``error`` shows hung (never came to the call it timed out in); ``()`` if none.

    Those a :class:`~collectives.CollectiveTimeout` waited for before its call
    started; ranks a timeout waited for later in a call may only be waiting for
    others, so they are not taken for hung.
    """
    if not isinstance(error, CollectiveTimeout) or error.step not in ("signature", "barrier 0"):
        return ()
    return tuple(error.peers)


def shrink(comm: "Communicator | MPI.Comm | None" = None, *, hung: Sequence[int] = ()) -> Shrunk:
    """After a rank died, a communicator over the survivors; collective over them.

    Call it on every surviving rank once a collective raised
    :class:`~collectives.BrokenCommunicatorError` (a
    :class:`~collectives.PeerFailedError` naming the dead rank, say) or
    :class:`~collectives.CollectiveTimeout`. It revokes the old communicator (so
    ranks still waiting in it stop at once), agrees with the others on who is gone
    (``MPI_Comm_shrink``, which tolerates further deaths while it runs) and makes
    a new :class:`~collectives.Communicator` with the old one's settings. The old
    one refuses every later call. Where ``comm`` was the default communicator the
    new one becomes the default.

    Args:
        comm: the communicator a rank died in.
        hung: ranks to treat as dead although they live (hung past the timeout; see
            :func:`hung_ranks`): their processes on this node are killed first.

    Raises:
        ConfigurationError: the MPI cannot survive a death (no ULFM), saying why,
            or a hung rank runs on another node.
    """
    require_fault_tolerance()
    from ..transport.mpi import MPITransport, end_without_finalize

    old = communicator_of(comm)
    transport = old.transport
    if not isinstance(transport, MPITransport):
        raise ConfigurationError(f"shrink needs an MPI communicator, got {type(transport).__name__}")
    watchdog = old.watchdog
    if watchdog.broken is None:
        watchdog.break_off("the survivors shrank it after a rank died")
    if hung:
        _end_hung(transport, hung)
    smaller, lost = transport.shrink()
    end_without_finalize()  # MPI_Finalize after a death can hang for good
    new = Communicator(
        smaller, timeout=watchdog.timeout, stall_warning=watchdog.stall_warning, check=watchdog.check
    )
    if _communicator.default is old:
        _communicator.default = new
    survivors = tuple(r for r in range(old.size) if r not in lost)
    return Shrunk(new, lost, survivors)


def _end_hung(transport: "MPITransport", ranks: Sequence[int], timeout: float = 10.0) -> None:
    """Kill the processes of ``ranks`` (hung) on this node, and wait until MPI sees them dead.

    ``MPI_Comm_shrink`` waits for every rank MPI thinks alive, so a hung rank would
    stop the recovery. The processes are found by their launch: ``$PMIX_NAMESPACE``
    and ``$PMIX_RANK`` in their environment.
    """
    launched = transport.world_ranks(ranks)
    namespace = os.environ.get("PMIX_NAMESPACE", "")
    found = _launched_here(namespace, set(launched)) if namespace else {}
    for pid in found.values():
        with contextlib.suppress(ProcessLookupError):  # another survivor may have killed it first
            os.kill(pid, signal.SIGKILL)
    if not transport.await_failed(ranks, timeout):
        raise ConfigurationError(
            f"rank(s) {', '.join(map(str, launched))} of MPI.COMM_WORLD hang and could not be ended "
            f"within {timeout:g} s (on another node, or outside this launch), so the survivors "
            "cannot shrink past them"
        )


def _launched_here(namespace: str, ranks: set[int]) -> dict[int, int]:
    """The process ids on this node of the ``ranks`` of launch ``namespace``, by rank (from /proc)."""
    found: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as environ:
                variables = dict(v.split(b"=", 1) for v in environ.read().split(b"\0") if b"=" in v)
        except OSError:
            continue
        rank = variables.get(b"PMIX_RANK", b"")
        if variables.get(b"PMIX_NAMESPACE") == namespace.encode() and rank.isdigit() and int(rank) in ranks:
            found[int(rank)] = int(entry)
    return found


@dataclass(frozen=True)
class Recovery:
    """What :func:`recover` gives each survivor.

    Attributes:
        communicator: the new communicator over the survivors.
        lost: the old ranks that died.
        survivors: for each new rank, its old rank.
        checkpointer: checkpoints go on here, on the new communicator, at the agreed version.
        version: the version every survivor went back to.
        adopted: the states (of that version) of the lost ranks this rank takes
            over, by their old rank; each lost rank is taken over by exactly one
            survivor: the first of its holders that lives.
    """

    communicator: Communicator
    lost: tuple[int, ...]
    survivors: tuple[int, ...]
    checkpointer: Checkpointer
    version: int
    adopted: dict[int, Any] = field(default_factory=dict)

    def state(self) -> Any:
        """This rank's own state of the agreed version (a new copy each call)."""
        return self.checkpointer.load()


def adopter_of(lost_rank: int, size: int, replicas: int, lost: tuple[int, ...]) -> int | None:
    """The old rank that takes over ``lost_rank``'s state: its first holder still alive; ``None`` if none."""
    return next((r for r in holders_of(lost_rank, size, replicas) if r not in lost), None)


def recover(checkpointer: Checkpointer, *, hung: Sequence[int] = ()) -> Recovery:
    """Shrink after a death, go back to the last checkpoint, and take over the lost ranks' states.

    Collective over the survivors. Every survivor goes back to its own state of
    the last checkpoint (a collective under way when the rank died may have
    finished on some survivors and not on others, so only the checkpoint is a
    state they share); each lost rank's state comes from the copy a survivor
    keeps (:class:`~collectives.resilience.Checkpointer` ``replicas``), and that
    survivor takes it over (:attr:`Recovery.adopted`). Checkpoints go on at the
    same version on the new communicator. A rank that dies while the survivors
    recover makes them shrink the old communicator again, past both. ``hung``:
    ranks to treat as dead (see :func:`shrink`).

    A rank that died while a checkpoint's copies travelled may leave some survivors
    one version ahead: they go back to the version before (``Checkpointer.roll_back``).

    Raises:
        ConfigurationError: the MPI cannot survive a death (no ULFM).
        CheckpointError: on every survivor: no checkpoint was taken yet, the
            survivors cannot meet at one version, or a lost rank's state has no
            surviving copy (more consecutive ranks died than there are ``replicas``).
    """
    size = checkpointer.size
    for _ in range(size):
        shrunk = shrink(checkpointer.comm, hung=hung)
        try:
            return _go_back(checkpointer, shrunk)
        except (BrokenCommunicatorError, CollectiveTimeout):
            _give_up(shrunk.communicator, checkpointer.comm)
    raise CheckpointError(f"rank {checkpointer.rank}: every rank but this one died while recovering")


def _go_back(checkpointer: Checkpointer, shrunk: Shrunk) -> Recovery:
    """The survivors agree on the version to go back to; each takes over the lost states it holds."""
    old_size, replicas = checkpointer.size, checkpointer.replicas
    new = shrunk.communicator
    versions = allgather(np.array([checkpointer.version], np.int64), comm=new)
    version = int(versions.min())
    if int(versions.max()) == version + 1:  # a rank died while a checkpoint's copies travelled
        went_back = 1
        if checkpointer.version > version:
            try:
                checkpointer.roll_back()
            except CheckpointError:
                went_back = 0
        versions = allgather(np.array([checkpointer.version if went_back else -1], np.int64), comm=new)
    if version == 0 or int(versions.max()) != version or int(versions.min()) != version:
        said = ", ".join(f"rank {old} at {int(v)}" for old, v in zip(shrunk.survivors, versions, strict=True))
        raise CheckpointError(
            f"rank {new.rank}: cannot go back to a checkpoint every survivor holds: {said}"
            + (" (none taken yet)" if version == 0 else "")
        )
    orphans = [d for d in shrunk.lost if adopter_of(d, old_size, replicas, shrunk.lost) is None]
    if orphans:
        raise CheckpointError(
            f"rank {new.rank}: no survivor keeps a copy of rank(s) {', '.join(map(str, orphans))} "
            f"(replicas={replicas}; lost ranks {', '.join(map(str, shrunk.lost))})"
        )
    mine = shrunk.survivors[new.rank]
    adopted = {
        d: checkpointer.replica_of(d)
        for d in shrunk.lost
        if adopter_of(d, old_size, replicas, shrunk.lost) == mine
    }
    going_on = Checkpointer(new, replicas=replicas, version=version)
    going_on.adopt(new.rank, checkpointer.replica_bytes(mine))
    return Recovery(new, shrunk.lost, shrunk.survivors, going_on, version, adopted)


def _give_up(failed: Communicator, old: Communicator) -> None:
    """Leave ``failed`` (a rank died while recovering on it) as the old one was; the default goes back."""
    from ..transport.mpi import MPITransport

    if failed.watchdog.broken is None:
        failed.watchdog.break_off("a rank died while the survivors recovered on it")
    if isinstance(failed.transport, MPITransport):
        failed.transport.forsake()
    if _communicator.default is failed:
        _communicator.default = old


def replace(recovery: Recovery, argv: Sequence[str]) -> Recovery:
    """Start a process in each lost rank's place, so that the world size stays; collective over the survivors.

    Each new process runs ``argv`` (``MPI_Comm_spawn``; e.g. ``[sys.executable, "train.py"]``)
    and calls :func:`join` there. The new communicator numbers the ranks as before the
    death: a replacement takes its lost rank's number. The survivor that adopted a lost
    rank's state sends it to the replacement (the result's ``adopted`` is empty), and
    checkpoints go on at the agreed version.
    """
    from ..transport.mpi import MPITransport

    survivors, lost, version = recovery.survivors, recovery.lost, recovery.version
    old = recovery.communicator
    transport = old.transport
    if not isinstance(transport, MPITransport):
        raise ConfigurationError(f"replace needs an MPI communicator, got {type(transport).__name__}")
    merged = transport.spawn_merge(argv, lost, survivors[old.rank])
    dog = old.watchdog
    comm = Communicator(merged, timeout=dog.timeout, stall_warning=dog.stall_warning, check=dog.check)
    replicas = recovery.checkpointer.replicas
    _header(comm, _REPLACED, version, replicas, *lost)  # the replacements learn who they are and the version
    for d in lost:
        _pass_state(comm, d, adopter_of(d, comm.size, replicas, lost), recovery.adopted.get(d))
    going_on = Checkpointer(comm, replicas=replicas, version=version)
    going_on.adopt(comm.rank, recovery.checkpointer.replica_bytes(recovery.checkpointer.rank))
    return Recovery(comm, lost, tuple(range(comm.size)), going_on, version)


_REPLACED, _GROWN = 1, 2  # the first number of the survivors' header: which of the two started the process


def _header(comm: Communicator, kind: int, *values: int) -> np.ndarray:
    """The survivors' header (``kind``, ``values``, then -1s) on every rank; a new process gives zeros."""
    header = np.full(3 + comm.size, -1 if kind else 0, np.int64)
    if kind:
        header[0] = kind
        header[1 : 1 + len(values)] = values
    rows: np.ndarray = allgather(header, comm=comm).reshape(comm.size, -1)
    found: np.ndarray = rows[int(np.argmax(rows[:, 0]))]  # a survivor's
    return found


def _joined(expected: int) -> tuple[Communicator, np.ndarray] | None:
    """In a spawned process: the communicator over its spawners and it, and the survivors' header."""
    from ..faults import disarm
    from ..transport.mpi import MPITransport, end_without_finalize

    if fault_tolerance_missing() is not None:
        return None
    merged = MPITransport.join_parent()
    if merged is None:
        return None
    disarm()
    end_without_finalize()  # it ends as the survivors do
    comm = Communicator(merged)
    header = _header(comm, 0)
    if int(header[0]) != expected:
        started, joins = ("replace", "join()") if header[0] == _REPLACED else ("grow", "join_grown()")
        raise ConfigurationError(f"this process was started by {started}: it enters with {joins}")
    return comm, header


def join() -> Recovery | None:
    """In a process :func:`replace` started: its place among the survivors, with the lost rank's state.

    ``None`` in any other process (the job's own ranks). Faults injected by
    ``$COLLECTIVES_FAULT`` are disarmed here: the replacement inherited them.

    Raises:
        ConfigurationError: :func:`grow` started this process (it enters with :func:`join_grown`).
    """
    joined = _joined(_REPLACED)
    if joined is None:
        return None
    comm, header = joined
    version, replicas = int(header[1]), int(header[2])
    lost = tuple(int(r) for r in header[3:] if r >= 0)
    mine = b""
    for d in lost:
        data = _pass_state(comm, d, adopter_of(d, comm.size, replicas, lost), None)
        if d == comm.rank:
            mine = data
    checkpointer = Checkpointer(comm, replicas=replicas, version=version)
    checkpointer.adopt(comm.rank, mine)
    return Recovery(comm, lost, tuple(range(comm.size)), checkpointer, version)


def grow(argv: Sequence[str], count: int, comm: "Communicator | MPI.Comm | None" = None) -> Communicator:
    """Start ``count`` processes running ``argv`` that join ``comm``'s ranks, numbered after them; collective.

    Each new process calls :func:`join_grown` (``hvd.init()`` does). Unlike
    :func:`replace`, no state travels: the caller brings the new ranks up to date
    (Horovod Elastic's ``state.sync()``). Where ``comm`` was the default
    communicator the new one becomes the default.

    Raises:
        ConfigurationError: ``count`` is below 1, or ``comm`` is not over MPI.
    """
    from ..transport.mpi import MPITransport

    if count < 1:
        raise ConfigurationError(f"grow needs at least one process to start, got count={count}")
    old = communicator_of(comm)
    transport = old.transport
    if not isinstance(transport, MPITransport):
        raise ConfigurationError(f"grow needs an MPI communicator, got {type(transport).__name__}")
    merged = transport.spawn_merge(argv, list(range(old.size, old.size + count)), old.rank)
    dog = old.watchdog
    new = Communicator(merged, timeout=dog.timeout, stall_warning=dog.stall_warning, check=dog.check)
    _header(new, _GROWN, old.size)
    if _communicator.default is old:
        _communicator.default = new
    return new


def join_grown() -> Communicator | None:
    """In a process :func:`grow` started: the communicator over the job's ranks and it, made the default.

    ``None`` in any other process (the job's own ranks). Faults injected by
    ``$COLLECTIVES_FAULT`` are disarmed here: the new process inherited them.

    Raises:
        ConfigurationError: :func:`replace` started this process (it enters with :func:`join`).
    """
    joined = _joined(_GROWN)
    if joined is None:
        return None
    _communicator.default = joined[0]
    return joined[0]


def _pass_state(comm: Communicator, lost: int, adopter: int | None, state: Any) -> bytes:
    """The adopter's copy of ``lost``'s state, broadcast (collective): its bytes, on every rank."""
    from .serial import dumps

    if adopter is None:
        raise CheckpointError(f"rank {comm.rank}: no survivor keeps a copy of rank {lost}")
    data = dumps(state) if comm.rank == adopter else np.zeros(0, np.uint8)
    size = broadcast(np.array([data.size], np.int64), root=adopter, comm=comm)
    if comm.rank != adopter:
        data = np.empty(int(size[0]), np.uint8)
    return bytes(broadcast(data, root=adopter, comm=comm))
