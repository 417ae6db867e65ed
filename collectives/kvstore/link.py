"""A worker's link to the servers: its keys, clock and requests in flight; what the store's helpers get."""

__all__ = ["GRACE_S", "WINDOW", "WorkerLink"]

import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import CollectivesError, KVStoreError, KVStoreTimeout, TransportError, UnknownKeyError
from ._adapter import Channel
from ._wire import (
    BUNDLE_BYTES,
    QUIET,
    REPLY_TAG,
    REQUEST_TAG,
    Kind,
    Message,
    Refusal,
    bundle,
    check_key,
    compose,
    key_bytes,
    unbundle,
)
from .handles import Claim, KeyInfo, ServerRequest, claimed, error_from
from .layout import Partition, Roles, partition

if TYPE_CHECKING:
    from .server import Server
    from .updaters import Optimizer

_SPIN_S = 2e-3  # a worker waiting for an answer polls this long since the last message before it sleeps
_MAILBOX_S = 1e-3  # a colocated worker waiting long looks this often for its own server's replies
GRACE_S = 5.0  # a worker waits this much past the timeout, so that a server's own error reaches it first
_QUIET_KINDS = (Kind.PUSH, Kind.CLOCK)  # answered at once by a server, so a later reply implies their OK
WINDOW = 64  # quiet requests to one server before one is acknowledged: a worker cannot flood a server


class WorkerLink:
    """What a worker keeps between calls, and the requests it sends to the servers and waits for.

    The store holds one; its helpers (rows, checkpoints, replicas) are given it
    rather than the store. ``keys`` and ``clock`` are the worker's; ``server``
    and ``thread`` are a colocated rank's own server and the thread serving it.

    A push or a clock is sent *quiet*: its server answers it only to refuse it.
    MPI delivers one rank's messages to another on one tag in the order sent, and a
    server handles a worker's requests in that order and answers a push or clock at
    once, so any later reply from that server confirms every quiet request sent to it
    before, and a refusal arrives before that reply. A refusal is raised by the
    worker's next wait (a pull, init, barrier, close, or a handle's ``wait``). Every
    :data:`WINDOW`-th request to a server is acknowledged all the same, so a worker
    that only pushes cannot pile up more than that unread at a server.

    Requests of one call to one server travel as one message (a ``BATCH``): they wait
    in an outbox until the call returns or waits (:meth:`flush`), and the server
    answers them together. A request larger than ``BUNDLE_BYTES`` goes alone.
    """

    def __init__(self, channel: Channel, roles: Roles, mode: str, partition_bytes: int) -> None:
        self.channel = channel
        self.rank = channel.rank
        self.roles = roles
        self.mode = mode
        self.partition_bytes = partition_bytes
        self.keys: dict[Any, KeyInfo] = {}
        self._raw_keys: dict[Any, bytes] = {}  # each key as it travels, made once (1 and "1" differ)
        self.requests: dict[int, ServerRequest] = {}
        self.clock = 0
        self.closed = False  # closed, or broken: no call goes on
        self.left = False  # close() sent its requests
        self.broken: str | None = None  # why the store is broken (see escaped), if it is
        self.collective = False  # whether the store runs collectives on its channel (sync rounds)
        self._server: Server | None = None
        self.mailbox: deque[Message] = deque()  # replies of this rank's own server: no MPI, no bytes
        self._own: Server | None = None  # the server requests to this rank go to in this process, if any
        self.thread: threading.Thread | None = None
        self.optimizer: Optimizer | None = None  # the one set, for checkpoints and states
        self.claim = Claim()  # one thread's call at a time
        self._next = 0
        self._barriers = 0
        # server -> req -> a quiet request sent to it
        self.unconfirmed: dict[int, dict[int, ServerRequest]] = {}
        self.refused: list[ServerRequest] = []  # quiet requests a server refused, raised by the next wait
        # server -> requests not sent yet (to this rank's own server: messages without bytes)
        self.outbox: dict[int, tuple[list[Any], list[ServerRequest]]] = {}
        self.claim.flush = self.flush  # a call's requests leave when it returns
        self.claim.escaped = self.escaped

    @property
    def server(self) -> "Server | None":
        """A colocated rank's own server (or a dedicated server rank's)."""
        return self._server

    @server.setter
    def server(self, server: "Server | None") -> None:
        # a colocated worker's requests to its own server, and the replies, skip MPI: the
        # worker's thread hands a request to the server, which leaves replies in the mailbox
        self._server = server
        if server is not None and self.roles.is_worker(self.rank):
            server.mailbox = self.mailbox
        self._own = server if server is not None and server.mailbox is self.mailbox else None

    # keys

    def meta(self, key: Any) -> KeyInfo:
        """What this worker knows of ``key``.

        Raises:
            KVStoreError: the store is closed, or ``key`` is not a key; UnknownKeyError: never initialised.
        """
        if self.closed:
            raise self.unusable()
        check_key(key)
        meta = self.keys.get(key)
        if meta is None:
            raise UnknownKeyError(f"key {key!r} was never initialised (rank {self.rank}); call init first")
        return meta

    def unusable(self) -> KVStoreError:
        """The error of a call on a closed or broken store."""
        if self.broken is not None:
            return KVStoreError(f"rank {self.rank}: {self.broken}")
        return KVStoreError(f"the store is closed on rank {self.rank}")

    def layout(self, key: Any, shape: tuple[int, ...], dtype: np.dtype[Any], pushes: int = 0) -> KeyInfo:
        """``key``'s partitions over this store's servers, for a value of ``shape`` and ``dtype``."""
        meta = KeyInfo(shape, dtype, (), pushes)
        meta.parts = partition(
            key, math.prod(shape), dtype.itemsize, self.roles.server_ranks, self.partition_bytes, meta.row
        )
        return meta

    # requests

    def send(
        self,
        kind: Kind,
        key: Any,
        part: Partition | None = None,
        *,
        server: int | None = None,
        stamp: int = 0,
        aux: int = 0,
        text: str = "",
        data: Any = None,
        on_data: Callable[[Message], None] | None = None,
    ) -> ServerRequest:
        """Send a request to ``part``'s server (or ``server``); its reply completes the request returned.

        A push or clock is quiet: done once sent, no reply comes unless the server
        refuses it (see the class's note).
        """
        dst = part.server if part is not None else server
        assert dst is not None
        self._next += 1
        request = ServerRequest(dst, key, on_data)
        pending = self.unconfirmed.setdefault(dst, {})
        # the window's last is answered, confirming the rest
        quiet = kind in _QUIET_KINDS and len(pending) < WINDOW
        raw_key = b"" if key is None else self._raw_keys.get(key)
        if raw_key is None:
            raw_key = self._raw_keys[key] = key_bytes(key)
        index = 0 if part is None else part.index
        # to this rank's own server: handed over as it is, never bundled (only bytes need that)
        own = self._own if dst == self.rank else None
        message = compose(
            kind,
            self.rank,
            in_process=own is not None,
            part=index,
            req=self._next,
            stamp=stamp,
            aux=aux,
            key=raw_key,
            text=text,
            data=data,
            flags=QUIET if quiet else 0,
        )
        if isinstance(message, bytearray) and len(message) > BUNDLE_BYTES:
            self.flush(dst)  # after the requests before it
            self._post(dst, message, [request])
        elif own is not None and isinstance(message, Message) and len(message.data) > BUNDLE_BYTES:
            self.flush(dst)  # handled now, as a large message is sent now: its copy is not kept
            own.take_all([message])
        else:
            waiting = self.outbox.setdefault(dst, ([], []))
            waiting[0].append(message)
            waiting[1].append(request)
        if quiet:
            pending[self._next] = request
            request.done = True
        else:
            self.requests[self._next] = request
        return request

    def flush(self, server: int | None = None) -> None:
        """Send the requests waiting in the outbox (to ``server``, or to every server), one message each."""
        if not self.outbox:  # as most calls return: nothing waits
            return
        for dst in list(self.outbox) if server is None else [server]:
            messages, requests = self.outbox.pop(dst, ([], []))
            if not messages:
                continue
            if dst == self.rank and self._own is not None:
                self._own.take_all(messages)
            else:
                self._post(dst, messages[0] if len(messages) == 1 else bundle(self.rank, messages), requests)

    def _post(self, dst: int, message: bytearray, requests: list[ServerRequest]) -> None:
        try:
            self.channel.send(message, dst, REQUEST_TAG)
        except TransportError as error:  # a dead server (ULFM): the store's error, naming it
            self.outbox.clear()
            raise self.failed(error, requests) from error

    def confirm(self) -> None:
        """Wait until every server has handled this worker's quiet requests (before a barrier or save).

        Raises:
            KVStoreError: a server refused one of them (see :meth:`wait_for`).
        """
        servers = [s for s, pending in self.unconfirmed.items() if pending]
        self.wait_for([self.send(Kind.CONFIRM, None, server=s) for s in servers])

    def failed(self, error: TransportError, requests: list[ServerRequest]) -> KVStoreError:
        """MPI's failure while ``requests`` were in flight, as the store's error naming servers and key."""
        servers = sorted({r.server for r in requests if not r.done}) or sorted({r.server for r in requests})
        key = next((r.key for r in requests if r.key is not None), None)
        what = f"key {key!r}" if key is not None else "a barrier, clock or close"
        return KVStoreError(
            f"rank {self.rank}: MPI failed while waiting for server rank{'s' if len(servers) > 1 else ''} "
            f"{', '.join(map(str, servers))} on {what} ({error})"
        )

    def take(self) -> bool:
        """Take a reply, and a request to this rank's server, if either has come; whether any did."""
        took = self._serve_one()
        return self.pump(0.0) or took

    def _serve_one(self) -> bool:
        """Serve a request to this rank's server that has come, if any (its thread may be waiting)."""
        server = self._server
        if server is None or self.thread is None:
            return False
        return server.take_next(wait=False)  # a busy server thread is serving meanwhile

    def pump(self, timeout: float) -> bool:
        """Take one reply (or a bundle of them), waiting at most ``timeout`` seconds; whether one came.

        This rank's own server's replies, in the mailbox, are taken all at once, as a bundle is.
        """
        mailbox = self.mailbox
        if mailbox:
            while mailbox:  # popleft, not iteration: the server thread may be appending
                self._answered(mailbox.popleft())
            return True
        message: Message | None
        if timeout <= 0:  # a poll (the wait's spin): one probe, no deadline to keep
            message = self.channel.take(REPLY_TAG)
        else:
            message = self.channel.receive(
                REPLY_TAG, min(timeout, _MAILBOX_S) if self._own is not None else timeout
            )
        if message is None:
            return False
        for reply in unbundle(message) if message.kind == Kind.BATCH else (message,):
            self._answered(reply)
        return True

    def _answered(self, message: Message) -> None:
        pending = self.unconfirmed.get(message.origin)
        if pending:  # a reply confirms the quiet requests sent to its server before it
            quiet = pending.pop(message.req, None)
            if quiet is not None:  # a refusal (a quiet request gets no other reply)
                self._fill(quiet, message)
                self.refused.append(quiet)
            for req in [r for r in pending if r < message.req]:
                del pending[req]
        request = self.requests.pop(message.req, None)
        if request is not None:
            self._fill(request, message)
        elif message.kind == Kind.ERROR and message.aux == Refusal.BROKEN and self.broken is None:
            self.broken = message.text  # a server's notice that another worker broke the store
            self.closed = True

    def _fill(self, request: ServerRequest, message: Message) -> None:
        request.stamp = message.stamp
        request.aux = message.aux
        if message.kind == Kind.ERROR:
            request.error = message.text
            request.fault = Refusal(message.aux)
            request.workers = tuple(int(w) for w in np.frombuffer(message.data, np.int64))
            if request.fault == Refusal.BROKEN and self.broken is None:  # another worker's call interrupted
                self.broken = message.text
                self.closed = True
        elif request.on_data is not None:
            request.on_data(message)
        request.done = True

    def _raise_refused(self) -> None:
        if self.refused:
            request = self.refused.pop(0)
            if self.broken is None or not self.left:  # a broken store's close is clean: the break was told
                raise error_from(request)

    @claimed
    def test(self, requests: list[ServerRequest]) -> None:
        """Take what has come for a handle's ``test``, without waiting."""
        try:
            self.flush()
            self.take()
        except TransportError as error:
            raise self.failed(error, requests) from error

    @claimed
    def wait_for(self, requests: list[ServerRequest]) -> None:
        """Wait until every one of ``requests`` has its reply, or raise naming the servers silent.

        A quiet request a server refused since the last wait is raised here (the
        first of them), whatever ``requests`` are.

        Raises:
            KVStoreError: this rank's server failed, or refused a quiet request (naming
                it, its key and server); KVStoreTimeout: a server did not answer in time.
        """
        try:
            self.flush()
            self._raise_refused()
            self._wait_for(requests)
            self._raise_refused()
        except KVStoreError:  # a KVStoreTimeout is a TransportError too
            raise
        except TransportError as error:  # a dead server (ULFM): the store's error, naming it
            raise self.failed(error, requests) from error

    def _wait_for(self, requests: list[ServerRequest]) -> None:
        limit = self.channel.timeout + GRACE_S
        deadline = time.monotonic() + limit
        busy = time.monotonic() + _SPIN_S
        if self.mailbox:  # this rank's own server answered already: no probe needed for that
            self.pump(0.0)
            # but a call to its own server runs no MPI, so it never let the server thread have the
            # interpreter lock: a peer's request may have waited all along (measured: a remote pull
            # 37 -> 33 us at 2 ranks)
            self._serve_one()
        while not all(r.done for r in requests):
            if time.monotonic() < busy:
                # the answer is likely near: poll without sleeping, and serve this rank's
                # requests meanwhile, so that they need not wait for its server thread to wake
                if self.take():
                    busy = time.monotonic() + _SPIN_S
                else:
                    os.sched_yield()  # where ranks outnumber cores, the one to answer may need this one's
                continue
            if self.server is not None and self.server.error is not None:
                raise KVStoreError(f"the server on rank {self.rank} failed: {self.server.error!r}")
            if self.broken is not None and not self.left:  # its answers may never come
                raise self.unusable()
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._silent(requests, limit)
            self.pump(min(left, 1.0))

    def _silent(self, requests: list[ServerRequest], limit: float) -> KVStoreTimeout:
        silent = sorted({r.server for r in requests if not r.done})
        return KVStoreTimeout(
            f"rank {self.rank} waited {limit:g} s for server rank{'s' if len(silent) > 1 else ''} "
            f"{', '.join(map(str, silent))} to answer (key {requests[0].key!r})",
            key=requests[0].key,
            servers=tuple(silent),
        )

    def escaped(self, what: str, error: BaseException) -> None:
        """Account for ``error`` leaving the store's call ``what``: every call's boundary (see ``claimed``).

        The store's own errors are its checks, made before anything is sent or
        counted, or what the servers or collectives told every worker concerned: the
        call's requests leave as they would have. Any other (an interrupt, a signal
        handler's exception) may have left this worker's rounds, clock or requests
        sent in part, or its collectives a call apart from its peers': the store
        breaks on every rank (:meth:`break_off`), naming the error.
        """
        if isinstance(error, CollectivesError):
            if self.broken is None:
                self.flush()
            return
        if self.broken is None:
            self.break_off(f"the store's {what} interrupted ({type(error).__name__})")
            error.add_note(f"rank {self.rank}: {self.broken}")

    def break_off(self, why: str) -> None:
        """Break the store on every rank, naming ``why``: every server refuses all but a close from now on.

        Each server fails the requests waiting at it and answers every later one
        with the reason (a worker so told is broken too); the store's communicator
        is broken on every rank where its calls are collectives. Nothing is waited for.
        """
        if self.broken is not None:
            return
        self.broken = f"rank {self.rank} broke the store: {why}; it is unusable now"
        self.closed = True
        self.outbox.clear()  # this call's requests not sent yet stay unsent
        self.refused.clear()
        if self.collective:
            self.channel.break_off(why)  # (a short why: the communicator's notice keeps 64 bytes)
        try:
            for server in self.roles.server_ranks:
                self.send(Kind.BREAK, None, server=server, text=self.broken)
                if self.left:  # an interrupted close: the servers need not wait for this worker
                    self.send(Kind.CLOSE, None, server=server)
            self.flush()
        except CollectivesError:  # a dead server: nothing to tell it
            self.outbox.clear()

    def settle(self) -> None:
        """Wait for every request in flight, quiet ones confirmed (before a checkpoint or state is taken)."""
        self.wait_for(list(self.requests.values()))
        self.confirm()

    def barrier(self, failed: bool = False) -> bool:
        """Return once every open worker has called it; whether any arrived ``failed``."""
        self.confirm()  # a push before the barrier is applied before any worker leaves it
        self._barriers += 1
        first = self.roles.server_ranks[0]
        request = self.send(Kind.BARRIER, None, server=first, stamp=self._barriers, aux=int(failed))
        self.wait_for([request])
        if request.error is not None:
            raise error_from(request)
        return bool(request.aux)
