"""The one place the store reaches into a Communicator: its own channel, apart from the user's traffic."""

__all__ = ["Channel", "open_channel"]

import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigurationError
from ..transport.base import Request, Transport
from ._wire import REPLY_TAG, REQUEST_TAG, STORE_FIELD, Message, decode

if TYPE_CHECKING:
    from ..communicator import Communicator

_FIRST_PAUSE_S = 1e-5
_PAUSE_S = 5e-4  # the longest sleep between probes: a message waits at most this long unseen
_UNTESTED = 16  # small sends kept before testing which completed: a test costs microseconds a message
_LARGE = 1 << 16  # a send at least this large is tested at once, so that its buffer goes soon


@dataclass
class Channel:
    """The store's communicator, its transport and timeout, and the sends it has in flight.

    Attributes:
        comm: a communicator of the store's own (a duplicate of the user's MPI
            communicator), for the collectives the store runs; on a loopback
            transport, which cannot be duplicated, the user's own.
        owned: whether the store made ``comm`` and frees it on close.
        store: the store's number, agreed by the ranks as it is created (see
            ``store.create``) and carried by each of its messages. MPI gives a freed
            communicator's context to the next one made, so messages of a store
            closed with some unreceived (the break of a store cut requests short)
            could otherwise be taken as a later store's own: they are dropped.
    """

    comm: "Communicator"
    owned: bool
    limit: float | None = None  # the store's own timeout, where it differs from the communicator's
    store: int = 0

    def __post_init__(self) -> None:
        self._sends: list[tuple[Request, Any]] = []  # (request, buffer kept alive until it completes)
        self._lock = threading.Lock()  # a colocated rank's worker and server thread both send
        self._taking: dict[int, threading.Lock] = {tag: threading.Lock() for tag in (REQUEST_TAG, REPLY_TAG)}
        self.rank = self.comm.rank  # read on every request: an attribute, not a chain of properties

    @property
    def transport(self) -> Transport:
        return self.comm.transport

    @property
    def timeout(self) -> float:
        """Seconds a server waits for a worker; ``math.inf`` for no limit."""
        if self.limit is not None:
            return math.inf if self.limit == 0 else self.limit
        return self.comm.timeout

    @property
    def size(self) -> int:
        return self.comm.size

    def tag_calls(self, tag: bytes) -> None:
        """Put ``tag`` in the signature of the store's next collectives (``b""``: none)."""
        self.comm.watchdog.tag = tag

    def break_off(self, why: str) -> None:
        """Break the store's communicator on every rank (its calls may be one apart), naming ``why``."""
        self.comm.watchdog.break_off(why)

    def send(self, buffer: Any, dst: int, tag: int) -> None:
        """Start sending message ``buffer``; it completes later (:meth:`progress`): no send waits for it."""
        STORE_FIELD[0].pack_into(buffer, STORE_FIELD[1], self.store)
        with self._lock:
            self._sends.append((self.transport.isend(buffer, dst, tag), buffer))
            crowded = len(self._sends) >= _UNTESTED or memoryview(buffer).nbytes >= _LARGE
        if crowded:
            self.progress()

    def progress(self) -> None:
        """Forget the sends that have completed."""
        with self._lock:
            if self._sends:
                pending = self.transport.wait_for([r for r, _ in self._sends], 0.0)
                self._sends = [self._sends[i] for i in pending]

    def flush(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds for every send in flight; whether they all completed."""
        deadline = time.monotonic() + timeout
        while self._sends:
            self.progress()
            if not self._sends:
                break
            if time.monotonic() >= deadline:
                return False
            time.sleep(1e-4)
        return True

    def take(self, tag: int) -> Message | None:
        """The next message with ``tag`` from any rank if one has come, else ``None``; never waits.

        A colocated rank's worker and server thread may both take requests, so a
        probe and the receive of what it found happen under one lock: another
        thread cannot receive the probed message in between. A message of another
        store (see :attr:`store`) is dropped.
        """
        while True:
            with self._taking[tag]:
                found = self.transport.take(tag)
            if found is None:
                return None
            message = decode(found[1])
            if message.store == self.store:
                return message

    def receive(self, tag: int, timeout: float) -> Message | None:
        """The next message with ``tag``, waiting at most ``timeout`` s; ``None`` if none came.

        Sleeps between probes, a little longer each time up to ``_PAUSE_S``, so
        that a thread waiting here does not take a core from its rank's worker.
        """
        deadline = time.monotonic() + timeout
        pause = _FIRST_PAUSE_S
        while True:
            message = self.take(tag)
            if message is not None:
                return message
            now = time.monotonic()
            if now >= deadline:
                return None
            time.sleep(min(pause, deadline - now))
            pause = min(2 * pause, _PAUSE_S)

    def close(self) -> None:
        if self.owned:
            self.comm.free()


def open_channel(comm: Any, timeout: float | None) -> Channel:
    """The store's channel over ``comm`` (a Communicator, an mpi4py communicator, a transport or ``None``)."""
    from ..communicator import Communicator

    if timeout is not None and not timeout >= 0:
        raise ConfigurationError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    if isinstance(comm, Communicator):
        limit = comm.timeout if timeout is None else timeout
        # bounded by the communicator's timeout: a rank that never creates the store makes the others raise
        own = comm.duplicate(timeout=0 if math.isinf(limit) else limit)
        if own is None:  # a loopback transport: the user's communicator, the store's own tags
            return Channel(comm, owned=False, limit=timeout)
        return Channel(own, owned=True)
    if isinstance(comm, Transport):
        return Channel(Communicator(comm, timeout=timeout), owned=False)
    return Channel(Communicator(comm, timeout=timeout), owned=True)
