"""Surviving faults: in-memory and directory checkpoints, and deterministic fault injection.

The API (stable; ``collectives.resilience``):

In memory, Rabit style (:mod:`.checkpoint`)
    ``ck = Checkpointer(comm=None, *, replicas=1, version=0)``;
    ``ck.checkpoint(state) -> version`` (collective: keeps this rank's pickled
    state and sends a copy to each of the next ``replicas`` ranks of the ring;
    the ranks agree on the version first); ``ck.load()`` (this rank's state of
    the last checkpoint, or ``None``); ``ck.version``; ``ck.held`` (the ranks
    whose states this rank keeps); ``ck.holders_of(rank)``;
    ``ck.replica_of(rank)`` / ``ck.replica_bytes(rank)`` (a lost rank's state
    from the copy a survivor keeps); ``ck.adopt(rank, data)``; ``ck.roll_back()``
    (to the version before the last, kept until the next checkpoint begins);
    ``holders_of(rank, size, replicas)``; :class:`CheckpointError`.
In a directory, for relaunching a job (:mod:`.directory`)
    ``save(directory, state, version, *, comm=None, keep=2, before_manifest=None) -> Path``
    (collective: every rank's file written atomically, then ``before_manifest(folder)``,
    then a manifest once every rank's is durable; a rank's file is a state file of
    :mod:`collectives.files`: allowed values only, checksummed); ``load(directory, *,
    comm=None, trusted=False, other_sizes="raise") -> (version, state) | None`` (the
    newest complete version, agreed by every rank; loading runs no code: the old
    pickled format only with ``trusted=True``; damage and another world size are
    named); ``complete_versions(directory, size=None)``; ``folder_of(directory,
    version)``; a version cut off mid-write is never loaded.
Fault injection (:mod:`collectives.faults`, imported by the watchdog, so it sits low)
    ``$COLLECTIVES_FAULT=RANK:NUMBER[:HOW]`` or ``RANK:checkpoint:NUMBER[:HOW]``
    (comma-separated; HOW = ``kill`` | ``exit`` | ``hang`` | ``raise``); in process:
    ``arm(text)``, ``disarm()``, :class:`InjectedFault`, :class:`Fault`.

Surviving a death under Open MPI with ULFM (:mod:`.recovery`)
    ``shrink(comm) -> Shrunk`` (communicator over the survivors, ``lost``, ``survivors``);
    ``recover(checkpointer) -> Recovery`` (shrink, go back to the last checkpoint, take
    over the lost ranks' states: ``adopted``; ``hung=hung_ranks(error)`` kills ranks
    that hung past the timeout so they count as dead); ``replace(recovery, argv) -> Recovery``
    (a new process in each lost rank's place, which calls ``join()``); ``grow(argv, count, comm=None)
    -> Communicator`` (new processes numbered after the ranks, which call ``join_grown()``; no state
    travels: Horovod Elastic's sync brings them up to date); ``fault_tolerance_missing()``.

torch models and optimizers go through :mod:`collectives.torch_integration.checkpoint`.
"""

__all__ = [
    "CheckpointError",
    "Checkpointer",
    "Fault",
    "InjectedFault",
    "Recovery",
    "Shrunk",
    "arm",
    "complete_versions",
    "disarm",
    "fault_tolerance_missing",
    "folder_of",
    "grow",
    "holders_of",
    "hung_ranks",
    "join",
    "join_grown",
    "load",
    "recover",
    "replace",
    "save",
    "shrink",
]

from ..faults import Fault, InjectedFault, arm, disarm
from .checkpoint import Checkpointer, CheckpointError, holders_of
from .directory import complete_versions, folder_of, load, save
from .recovery import (
    Recovery,
    Shrunk,
    fault_tolerance_missing,
    grow,
    hung_ranks,
    join,
    join_grown,
    recover,
    replace,
    shrink,
)
