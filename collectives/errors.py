"""Exceptions raised by collectives."""

__all__ = [
    "BrokenCommunicatorError",
    "CalibrationError",
    "CheckpointError",
    "CollectiveTimeout",
    "CollectivesError",
    "ConcurrentCallError",
    "ConfigurationError",
    "FreedCommunicatorError",
    "InvalidBufferError",
    "InvalidRootError",
    "InvalidRowsError",
    "KVStoreError",
    "KVStoreTimeout",
    "KeyMismatchError",
    "MismatchError",
    "PeerFailedError",
    "PeerInputError",
    "PersistentStateError",
    "ScheduleError",
    "TopologyError",
    "TransportError",
    "UnknownAlgorithmError",
    "UnknownKeyError",
    "UnsupportedDtypeError",
    "UnsupportedOpError",
]


class CollectivesError(Exception):
    """Base class of every error this library raises."""


class UnsupportedDtypeError(CollectivesError, TypeError):
    """The array's dtype cannot be communicated or reduced."""


class UnsupportedOpError(CollectivesError, ValueError):
    """The reduction op is unknown or does not apply to the dtype."""


class UnknownAlgorithmError(CollectivesError, ValueError):
    """No algorithm of that name implements the collective."""


class InvalidBufferError(CollectivesError, ValueError):
    """An input or output buffer has the wrong shape, size, dtype or layout."""


class InvalidRootError(CollectivesError, ValueError):
    """The root of a rooted collective is not a rank of the communicator."""


class ScheduleError(CollectivesError):
    """A schedule is malformed or does not meet its collective's contract.

    Attributes name the first place the simulator found wrong; any of them may be
    ``None`` when it does not apply.
    """

    def __init__(
        self,
        message: str,
        *,
        step: int | None = None,
        rank: int | None = None,
        chunk: int | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        super().__init__(message)
        self.step = step
        self.rank = rank
        self.chunk = chunk
        self.expected = expected
        self.actual = actual


class TopologyError(CollectivesError, ValueError):
    """A topology is malformed, or a device, route or placement is not in it."""


class TransportError(CollectivesError, RuntimeError):
    """A point-to-point transfer failed."""


class CollectiveTimeout(TransportError, TimeoutError):
    """A collective did not complete in time.

    Attributes say where this rank was stuck; any of them may be ``None`` when
    the timeout came from below the library's own bookkeeping.

    Attributes:
        collective: the collective's name.
        sequence: its sequence number on the communicator.
        step: the step this rank was waiting in (``"signature"`` while the
            ranks agree on the call, ``"barrier k"`` in the shared-memory executor, else the
            schedule's step number).
        peers: the ranks this rank was still waiting for.
    """

    def __init__(
        self,
        message: str,
        *,
        collective: str | None = None,
        sequence: int | None = None,
        step: int | str | None = None,
        peers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message)
        self.collective = collective
        self.sequence = sequence
        self.step = step
        self.peers = peers


class BrokenCommunicatorError(TransportError):
    """A collective on the communicator did not finish on some rank, so no later one can run on it.

    A call interrupted on one rank (``KeyboardInterrupt``, an exception from a signal
    handler), a timeout, a failed peer or two threads' calls at once leave the ranks
    unsure which messages belong to which call; rather than risk a wrong result the
    communicator refuses every later call, on the rank where it happened and, once
    they hear of it, on the others. Make a new communicator.

    Attributes:
        rank: the rank where the communicator broke, where known.
    """

    def __init__(self, message: str, *, rank: int | None = None) -> None:
        super().__init__(message)
        self.rank = rank


class PeerFailedError(BrokenCommunicatorError):
    """MPI failed a transfer of a collective (a peer that died, say).

    Attributes:
        collective: the collective's name.
        sequence: its sequence number on the communicator.
        peers: the ranks of the transfers that failed, where MPI says.
    """

    def __init__(
        self, message: str, *, collective: str, sequence: int, peers: tuple[int, ...], rank: int
    ) -> None:
        super().__init__(message, rank=rank)
        self.collective = collective
        self.sequence = sequence
        self.peers = peers


class ConcurrentCallError(BrokenCommunicatorError):
    """A thread called a collective while another thread's call on the same communicator was running.

    The ranks could not pair such calls alike, so the call is refused and the
    communicator broken on every rank (see the README's "Threads"): order the
    threads' calls yourself, or give each thread a communicator of its own.

    Attributes:
        running: the name of the thread whose call was running.
        calling: the name of the thread whose call was refused.
    """

    def __init__(self, message: str, *, running: str, calling: str, rank: int) -> None:
        super().__init__(message, rank=rank)
        self.running = running
        self.calling = calling


class FreedCommunicatorError(CollectivesError, RuntimeError):
    """The communicator was freed (:meth:`~collectives.Communicator.free`); make a new one."""


class PersistentStateError(CollectivesError, RuntimeError):
    """A persistent collective used out of turn: started again before its wait, or waited for unstarted."""


class MismatchError(CollectivesError, ValueError):
    """The ranks called different collectives, or the same one with different arguments.

    Attributes:
        fields: each field the ranks disagree on, mapped to its values and the
            ranks that passed each one.
    """

    def __init__(self, message: str, fields: dict[str, dict[str, tuple[int, ...]]]) -> None:
        super().__init__(message)
        self.fields = fields


class PeerInputError(MismatchError):
    """Another rank's own checks of the same call failed, so the call runs on no rank.

    That rank raised its own error (an :class:`InvalidBufferError`, say) and told
    the others in the signature exchange instead of leaving them to wait for the
    timeout (see :mod:`collectives.watchdog`). The communicator stays in step, so
    the next call can run.

    Attributes:
        problems: each rank whose checks failed, mapped to its error's type and
            message (cut to 64 bytes).
    """

    def __init__(
        self, message: str, fields: dict[str, dict[str, tuple[int, ...]]], problems: dict[int, str]
    ) -> None:
        super().__init__(message, fields)
        self.problems = problems


class ConfigurationError(CollectivesError, ValueError):
    """A setting, from an argument or an environment variable, has a value that cannot be used."""


class CalibrationError(CollectivesError, ValueError):
    """A calibration file cannot be read or does not hold the cost model's constants."""


class CheckpointError(CollectivesError):
    """A checkpoint cannot be taken or restored: ranks out of step, a copy not held, a partial version.

    Also a checkpoint file that is damaged, not of this library's format, or would run code to load.
    """


class KVStoreError(CollectivesError):
    """The key-value store (:mod:`collectives.kvstore`) cannot do what was asked."""


class UnknownKeyError(KVStoreError, KeyError):
    """A key was pushed or pulled before :meth:`~collectives.kvstore.KVStore.init` made it."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class InvalidRowsError(KVStoreError, IndexError):
    """The ``rows=`` of a push or pull are out of range, repeated, or given for a 1-D key."""


class KeyMismatchError(KVStoreError, InvalidBufferError):
    """A value's shape or dtype differs from its key's, or the workers initialised a key differently."""


class KVStoreTimeout(KVStoreError, CollectiveTimeout):
    """A push, pull or close did not complete in the store's time.

    Attributes:
        key: the key waited on, ``None`` for a barrier or close.
        workers: the workers the server was still waiting for (in ``sync`` and
            ``ssp`` modes), or that had not closed the store.
        servers: the servers that did not answer.
    """

    def __init__(
        self,
        message: str,
        *,
        key: object = None,
        workers: tuple[int, ...] = (),
        servers: tuple[int, ...] = (),
    ) -> None:
        super().__init__(message, collective="kvstore", peers=tuple(sorted({*workers, *servers})))
        self.key = key
        self.workers = workers
        self.servers = servers
