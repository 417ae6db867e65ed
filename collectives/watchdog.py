"""Each collective's guard: agreed signature, bounded waits, a flight recorder and a debug log.

A :class:`Watchdog` belongs to one communicator. Around every collective it

- numbers the call (its sequence number on the communicator);
- unless checking is off, exchanges a :class:`~collectives.signature.Signature`
  with every other rank (one fixed-size message each way, on its own tag; or,
  once the communicator's ranks share memory, posted for a barrier of it, which
  the shared-memory executor's first barrier can be: see :meth:`Watchdog.agree_through`)
  and raises :class:`~collectives.errors.MismatchError` on every rank if they differ;
- when a rank's own checks of a call fail (a bad buffer, op, root ...), still
  takes that rank through the exchange with a *poisoned* signature naming its
  error (:meth:`Watchdog.poison`), so the other ranks raise
  :class:`~collectives.errors.PeerInputError` at once instead of waiting for
  the timeout, and the sequence numbers stay in step; with checking off there
  is no exchange, and the other ranks wait until the timeout;
- bounds every wait by the communicator's timeout (messages, and the barriers
  of the shared-memory executor): a collective that has not completed by then
  raises :class:`~collectives.errors.CollectiveTimeout` naming
  the step and the peers still awaited, with this rank's flight recorder; a
  warning on the ``collectives`` logger after the shorter stall interval names
  the ranks not heard from yet;
- keeps the last calls in a flight recorder, and with ``COLLECTIVES_DEBUG=1``
  writes one line per call to stderr or to ``COLLECTIVES_DEBUG_FILE``.

MPI cannot cancel a send in general, so after a timeout the messages in flight
stay posted and the communicator refuses further collectives; make a new one.
"""

__all__ = [
    "CHECK_ENV",
    "DEBUG_ENV",
    "DEBUG_FILE_ENV",
    "DEFAULT_STALL_WARNING_S",
    "DEFAULT_TIMEOUT_S",
    "FUSED_BYTES",
    "RECORDER_ENV",
    "SIGNATURE_TAG",
    "STALL_WARNING_ENV",
    "TIMEOUT_ENV",
    "Call",
    "Guard",
    "Watchdog",
]

import logging
import math
import os
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from ._env import env_flag
from .errors import CollectivesError, CollectiveTimeout, ConfigurationError, PeerInputError, TransportError
from .signature import SIGNATURE_BYTES, Signature, disagreement, problem_of
from .transport.base import Request, SharedMemory, Transport, WrappedTransport

SIGNATURE_TAG = 9
"""Tag of the signature messages, apart from the executor's (7) and the selector's (8)."""

TIMEOUT_ENV = "COLLECTIVES_TIMEOUT"
STALL_WARNING_ENV = "COLLECTIVES_STALL_WARNING"
CHECK_ENV = "COLLECTIVES_CHECK"
DEBUG_ENV = "COLLECTIVES_DEBUG"
DEBUG_FILE_ENV = "COLLECTIVES_DEBUG_FILE"
RECORDER_ENV = "COLLECTIVES_FLIGHT_RECORDER"

DEFAULT_TIMEOUT_S = 1800.0
"""30 minutes, as torch.distributed's default."""

DEFAULT_STALL_WARNING_S = 60.0
"""As Horovod's stall check; never later than half the timeout."""

_DEFAULT_RECORDED = 64

FUSED_BYTES = 4096
"""The most data bytes that may travel to one peer with a call's signature (see :class:`Guard`)."""

_log = logging.getLogger("collectives")


def _nothing() -> None:
    """What a watchdog does on a mismatch unless told otherwise."""


def _seconds(value: float | None, env: str, default: float) -> float:
    """A duration from the argument, else the environment, else ``default``; 0 or inf means never."""
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        try:
            value = float(text)
        except ValueError:
            raise ConfigurationError(f"{env}={text!r} is not a number of seconds") from None
    if math.isnan(value) or value < 0:
        raise ConfigurationError(f"a duration must be a non-negative number of seconds, got {value}")
    return math.inf if value == 0 else float(value)


def _flag(value: bool | None, env: str, default: bool) -> bool:
    if value is not None:
        return value
    setting = env_flag(env)
    return default if setting is None else setting


_SEQUENCE = struct.Struct("<q")  # a packed signature starts with its sequence number


class Guard:
    """What every call of one kind on a communicator agrees on, packed once and reused.

    The ranks exchange :attr:`packed` with the call's sequence number written in
    front, so a repeated call packs nothing anew. A small call's first messages may
    travel with it: the signature message to a peer in :attr:`outgoing` carries the
    data after the signature, and the peer finds it with :meth:`Watchdog.arrived`.

    Attributes:
        signature: the call's signature, its sequence number 0.
        packed: the packed signature, sent by one call at a time.
        outgoing: per peer, the data that travels with the signature (after it).
    """

    __slots__ = ("_messages", "outgoing", "packed", "signature")

    def __init__(self, signature: Signature, payloads: dict[int, int] | None = None) -> None:
        self.signature = signature
        self.packed = bytearray(signature.pack())
        payloads = payloads or {}
        if any(size > FUSED_BYTES for size in payloads.values()):
            raise ValueError(f"at most {FUSED_BYTES} bytes travel with a signature; got {payloads}")
        self._messages = {peer: bytearray(SIGNATURE_BYTES + size) for peer, size in payloads.items()}
        self.outgoing = {peer: memoryview(m)[SIGNATURE_BYTES:] for peer, m in self._messages.items()}

    def message(self, peer: int) -> bytearray:
        """What goes to ``peer``: the signature, then any data for it."""
        return self._messages.get(peer, self.packed)

    def stamp(self, sequence: int) -> None:
        """Write the call's sequence number into every message."""
        _SEQUENCE.pack_into(self.packed, 0, sequence)
        if self._messages:
            for message in self._messages.values():
                message[:SIGNATURE_BYTES] = self.packed


class _Tracked:
    """A request with the peer it waits on, and whether it sends."""

    __slots__ = ("peer", "request", "sends")

    def __init__(self, request: Request, peer: int, sends: bool) -> None:
        self.request = request
        self.peer = peer
        self.sends = sends


class _WatchedTransport(WrappedTransport):
    """The transport the executor gets: each ``waitall`` is one step, bounded by the call's deadline.

    Pointed at the call in progress. ``inner`` is the communicator's transport (one
    such per watchdog, reused by every call), or one over a subgroup of its ranks (a
    rail between nodes) or a device path, whose rank ``i`` is the communicator's
    ``ranks[i]``.
    """

    def __init__(self, inner: Transport, ranks: tuple[int, ...] | None = None) -> None:
        super().__init__(inner)
        self._ranks = ranks
        self.call: Call | None = None
        self.steps = 0

    def _peer(self, peer: int) -> int:
        return peer if self._ranks is None else self._ranks[peer]

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return _Tracked(self._inner.isend(buffer, dst, tag), self._peer(dst), True)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return _Tracked(self._inner.irecv(buffer, src, tag), self._peer(src), False)

    def waitall(self, requests: list[Request]) -> None:
        step = self.steps
        self.steps += 1
        call = self.call
        if call is None:
            raise TransportError("a watched transport was used outside its collective")
        call.wait([t.request for t in requests], step, requests, self._inner)


class Call:
    """One collective: the transport to run it on and its deadlines, then its entry in the flight recorder.

    Attributes:
        signature: the call's fields; its own sequence number is ``sequence``.
        sequence: the call's number on its communicator.
        algorithm: the algorithm that runs, once chosen (the recorder shows it).
        transport: the transport to give the executor.
        outcome: ``"running"``, then ``"ok"``, ``"timed out"`` or ``"failed: ..."``.
        seconds: how long the call took, once it ended.
    """

    __slots__ = (
        "_barriers",
        "_deadline",
        "_pending",
        "_started",
        "_warn_at",
        "_warned",
        "_watched",
        "algorithm",
        "outcome",
        "seconds",
        "sequence",
        "signature",
        "started",
        "transport",
        "watchdog",
    )

    def __init__(self, watchdog: "Watchdog", signature: Signature, sequence: int) -> None:
        # one object per call, its own record too: a small allreduce takes a few microseconds
        self.watchdog = watchdog
        self.signature = signature
        self.sequence = sequence
        self.algorithm = signature.algorithm
        self.started = time.time()  # for comparing ranks' logs
        self.seconds: float | None = None
        self.outcome = "running"
        self._started = started = time.monotonic()
        self._deadline = started + watchdog.timeout
        self._warn_at = started + watchdog.stall_warning
        self._warned = False
        self._barriers = 0
        self._pending: Guard | None = None  # a signature to post with the first barrier and check after it
        watched = watchdog.watched
        self._watched = watched is not None
        if watched is None:
            self.transport: Transport = watchdog.transport
        else:
            watched.call = self
            watched.steps = 0
            self.transport = watched

    def line(self, rank: int) -> str:
        """The call as the flight recorder and the debug log show it."""
        s = self.signature
        took = "-" if self.seconds is None else f"{self.seconds * 1e3:.3f}ms"
        clock = (
            time.strftime("%H:%M:%S", time.localtime(self.started)) + f".{int(self.started % 1 * 1e6):06d}"
        )
        return (
            f"collectives rank {rank} #{self.sequence} {s.collective} count={s.count} "
            f"dtype={s.dtype or '-'} op={s.op or '-'} root={'-' if s.root < 0 else s.root} "
            f"algorithm={self.algorithm} start={clock} time={took} {self.outcome}"
        )

    def run_on(self, transport: Transport) -> None:
        """Send the collective's messages over ``transport``, e.g. a device transport over the communicator's.

        The signature check has already used the communicator's own transport.
        """
        self.transport = self.watch(transport)

    def watch(self, inner: Transport, ranks: tuple[int, ...] | None = None) -> Transport:
        """``inner`` with its waits bounded by this call's deadline; its rank ``i`` is ``ranks[i]`` here."""
        if not self._watched:
            return inner
        watched = _WatchedTransport(inner, ranks)
        watched.call = self
        return watched

    def wait(
        self,
        requests: list[Request],
        step: int | str,
        peers: Sequence[Any],
        transport: Transport | None = None,
    ) -> None:
        """Wait for ``requests`` (of ``transport``, the communicator's by default) until the deadline.

        Warns once at the stall interval. ``peers[i]`` tells whom ``requests[i]`` waits
        on (its ``peer``) and whether it sends (its ``sends``); only a stall or a
        timeout reads it.
        """
        transport = self.watchdog.transport if transport is None else transport
        if not self._watched:  # neither a deadline nor a warning
            transport.waitall(requests)
            return
        if not self._warned:
            pending = transport.wait_for(requests, max(self._warn_at - time.monotonic(), 0.0))
            if not pending:
                return
            self._warned = True
            requests = [requests[i] for i in pending]
            peers = [peers[i] for i in pending]
            _log.warning(
                "rank %d: %s #%d has waited %.3g s %s for %s",
                transport.rank,
                self.signature.collective,
                self.sequence,
                time.monotonic() - self._started,
                "to start" if step == "signature" else f"in step {step}",
                _ranks(p.peer for p in peers),
            )
        pending = transport.wait_for(requests, max(self._deadline - time.monotonic(), 0.0))
        if pending:
            stuck = [_Tracked(requests[i], peers[i].peer, peers[i].sends) for i in pending]
            self._time_out(stuck, step, transport)

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        """Pass the next barrier of ``shared``, leaving ``note``, by the deadline; warn at the stall interval.

        ``shared``'s rank ``i`` is this communicator's ``ranks[i]`` (all of them, in order, by default).
        """
        passed = self._barriers
        self._barriers = passed + 1
        pending = self._pending
        if pending is not None:
            shared.post(pending.packed)
        shared.arrive(note)
        if not self._warned:
            missing = shared.wait(max(self._warn_at - time.monotonic(), 0.0))
            if not missing:
                if pending is not None:
                    self._pending = None
                    self.watchdog._compare_posted(shared, pending, self.sequence)
                return
            self._warned = True
            _log.warning(
                "rank %d: %s #%d has waited %.3g s in %s for %s",
                self.watchdog.transport.rank,
                self.signature.collective,
                self.sequence,
                time.monotonic() - self._started,
                f"barrier {passed}",
                _ranks(tuple(missing if ranks is None else [ranks[r] for r in missing])),
            )
        missing = shared.wait(max(self._deadline - time.monotonic(), 0.0))
        if missing:
            shared.abandon()
            self._fail(tuple(missing if ranks is None else [ranks[r] for r in missing]), f"barrier {passed}")
        if pending is not None:
            self._pending = None
            self.watchdog._compare_posted(shared, pending, self.sequence)

    def _time_out(self, stuck: list[_Tracked], step: int | str, transport: Transport) -> None:
        peers = tuple(sorted({t.peer for t in stuck}))
        # MPI cannot cancel the sends: keep their buffers alive, and the communicator out of use
        self.watchdog.abandoned.extend(stuck)
        transport.abandon([t.request for t in stuck if not t.sends], [t.request for t in stuck if t.sends])
        self._fail(peers, step)

    def _fail(self, peers: tuple[int, ...], step: int | str) -> None:
        watchdog = self.watchdog
        collective, sequence = self.signature.collective, self.sequence
        self.outcome = "timed out"
        where = "before it started" if step == "signature" else f"in {step}"
        if isinstance(step, int):
            where = f"in step {step}"
        message = (
            f"rank {watchdog.transport.rank}: {collective} #{sequence} did not complete in "
            f"{watchdog.timeout:g} s; stuck {where} waiting for {_ranks(peers)}; "
            "this communicator is unusable now"
        )
        watchdog.broken = message
        raise CollectiveTimeout(
            f"{message}\n{watchdog.flight_record_text()}",
            collective=collective,
            sequence=sequence,
            step=step,
            peers=peers,
        )


def _ranks(peers: Iterator[int] | tuple[int, ...]) -> str:
    ranks = sorted(set(peers))
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


class Watchdog:
    """One communicator's sequence numbers, signature checks, deadlines, flight recorder and debug log.

    Args:
        transport: the communicator's transport.
        timeout: seconds a collective may take; ``$COLLECTIVES_TIMEOUT`` or 30
            minutes when ``None``; 0 or ``math.inf`` for no limit.
        stall_warning: seconds after which a waiting collective logs the ranks
            it waits for; ``$COLLECTIVES_STALL_WARNING`` or ``min(60, timeout / 2)``
            when ``None``; 0 or ``math.inf`` for no warning.
        check: whether the ranks agree on every call's signature unless the call
            says otherwise; ``$COLLECTIVES_CHECK`` (``0`` or ``1``) or on when ``None``.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        timeout: float | None = None,
        stall_warning: float | None = None,
        check: bool | None = None,
    ) -> None:
        self.transport = transport
        self.timeout = _seconds(timeout, TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
        self.stall_warning = _seconds(
            stall_warning, STALL_WARNING_ENV, min(DEFAULT_STALL_WARNING_S, self.timeout / 2)
        )
        self.check = _flag(check, CHECK_ENV, True)
        self.debug = _flag(None, DEBUG_ENV, False)
        self.debug_file = os.environ.get(DEBUG_FILE_ENV) or None
        kept = os.environ.get(RECORDER_ENV, "").strip()
        if kept and not kept.isdigit():
            raise ConfigurationError(f"{RECORDER_ENV}={kept!r} is not a number of calls")
        self.recorder: deque[Call] = deque(maxlen=int(kept) if kept else _DEFAULT_RECORDED)
        self.sequence = 0
        self.broken: str | None = None
        self.abandoned: list[_Tracked] = []
        watched = math.isfinite(self.timeout) or math.isfinite(self.stall_warning)
        self.watched = _WatchedTransport(transport) if watched else None
        # the signature exchange's buffers and peers, the same for every call
        self._rank, self._size = transport.rank, transport.size
        self._peers = [peer for peer in range(self._size) if peer != self._rank]
        self._exchange = [_Tracked(None, peer, False) for peer in self._peers]
        self._exchange += [_Tracked(None, peer, True) for peer in self._peers]
        self._received = [bytearray(SIGNATURE_BYTES + FUSED_BYTES) for _ in range(self._size)]
        self._heads = [memoryview(r)[:SIGNATURE_BYTES] for r in self._received]
        self.shared: SharedMemory | None = None
        self._on_mismatch: Callable[[], None] = _nothing

    def agree_through(self, shared: SharedMemory, on_mismatch: Callable[[], None] = _nothing) -> None:
        """Agree on signatures through ``shared`` (over every rank, in order) from the next call on.

        Each call posts its signature for a barrier of ``shared`` and reads the
        others' after it, in place of messages: cheaper, and the shared-memory
        executor's first barrier can carry it (see :meth:`begin`). Collective: every
        rank must switch before the same call. ``on_mismatch`` runs on every rank
        whose call found the signatures different, before the error is raised.
        """
        if shared.MESSAGE_BYTES >= SIGNATURE_BYTES and self._size > 1:
            self.shared = shared
            self._on_mismatch = on_mismatch

    def arrived(self, peer: int, size: int) -> memoryview:
        """The ``size`` data bytes that came with the last signature from ``peer`` (see :class:`Guard`)."""
        return memoryview(self._received[peer])[SIGNATURE_BYTES : SIGNATURE_BYTES + size]

    def flight_record(self) -> list[str]:
        """The recorded calls, oldest first, one line each."""
        return [call.line(self.transport.rank) for call in self.recorder]

    def flight_record_text(self) -> str:
        lines = self.flight_record()
        return f"last {len(lines)} collectives on rank {self.transport.rank}:\n  " + "\n  ".join(lines)

    def guard(
        self,
        collective: str,
        algorithm: str,
        count: int,
        dtype: str = "",
        op: str = "",
        root: int = -1,
        counts: tuple[int, ...] | None = None,
        *,
        backend: str = "",
        payloads: dict[int, int] | None = None,
    ) -> Guard:
        """The packed signature of a call; keep it to begin repeated calls with (see :meth:`begin`).

        ``payloads`` gives, per peer, the bytes of data that travel with the signature.
        """
        return Guard(Signature(0, collective, algorithm, dtype, op, root, count, counts, backend), payloads)

    @contextmanager
    def watch(self, guard: Guard, check: bool | None = None) -> Iterator[Call]:
        """Number, check, bound and record the call of ``guard`` run in the ``with`` block.

        Raises:
            MismatchError: on every rank, when their calls differ.
            CollectiveTimeout: the call did not complete in time.
            TransportError: an earlier call timed out, so this communicator is unusable.
        """
        call = self.begin(guard, check)
        try:
            yield call
        except BaseException as error:
            self.end(call, error)
            raise
        self.end(call)

    def begin(self, guard: Guard, check: bool | None = None, *, first_barrier: bool = False) -> Call:
        """Number, record and (unless ``check`` is off) check a call; :meth:`end` must follow.

        With ``first_barrier``, where signatures go through shared memory (see
        :meth:`agree_through`), the call's first :meth:`Call.barrier` on that memory
        carries and checks the signature: the caller promises that the call does
        nothing another rank can see before it. Otherwise the check is done here.

        Raises:
            MismatchError: on every rank, when their calls differ.
            CollectiveTimeout: the ranks did not all start the call in time.
            TransportError: an earlier call timed out, so this communicator is unusable.
        """
        if self.broken is not None:
            raise TransportError(
                f"an earlier collective timed out, so this communicator is unusable: {self.broken}"
            )
        sequence = self.sequence
        self.sequence = sequence + 1
        call = Call(self, guard.signature, sequence)
        self.recorder.append(call)
        if (self.check if check is None else check) and self._size > 1:
            try:
                if self.shared is not None and first_barrier:
                    guard.stamp(sequence)
                    call._pending = guard
                else:
                    self._agree(call, guard, sequence)
            except BaseException as error:
                self.end(call, error)
                raise
        return call

    def poison(
        self, collective: str, algorithm: object, error: BaseException, check: bool | None = None
    ) -> None:
        """Take a call whose checks failed on this rank through the signature exchange, so no rank waits.

        The call is numbered and recorded like any other; unless checking is off
        its signature, poisoned with ``error``'s type and message, goes to every
        other rank, whose matching call raises
        :class:`~collectives.errors.PeerInputError`. The caller then raises
        ``error``. A failure of the exchange itself (a timeout, which leaves
        the communicator unusable) or another rank's failed checks are added to
        ``error`` as a note. Nothing is sent once the communicator is unusable.
        """
        if self.broken is not None:
            return
        sequence = self.sequence
        self.sequence = sequence + 1
        signature = Signature(0, collective, str(algorithm), problem=problem_of(error))
        call = Call(self, signature, sequence)
        self.recorder.append(call)
        try:
            if (self.check if check is None else check) and self._size > 1:
                self._agree(call, Guard(signature), sequence)
        except PeerInputError as others:
            # every rank's checks failed or the ranks were out of step too: say so beside this rank's own
            if set(others.problems) != {self._rank} or set(others.fields) != {"problem"}:
                error.add_note(f"rank {self._rank} told the other ranks; they say: {others}")
        except CollectivesError as failure:
            error.add_note(f"rank {self._rank} could not tell the other ranks: {failure}")
        finally:
            self.end(call, error)

    def end(self, call: Call, error: BaseException | None = None) -> None:
        """Record how ``call`` ended: ``error`` if it raised one."""
        if call._pending is not None and error is None and self.shared is not None:
            # a call that promised a barrier and passed none still checks its signature
            try:
                call.barrier(self.shared)
            except BaseException as failure:
                self.end(call, failure)
                raise
        call.outcome = "ok" if error is None else f"failed: {type(error).__name__}"
        call.seconds = time.monotonic() - call._started
        if self.watched is not None:
            self.watched.call = None
        if self.debug:
            self._write(call.line(self.transport.rank))

    def _agree(self, call: Call, guard: Guard, sequence: int) -> None:
        """Exchange signatures with every other rank; raise on every rank if any differ."""
        guard.stamp(sequence)
        if self.shared is not None:
            call._pending = guard
            call.barrier(self.shared)
            return
        transport = self.transport
        mine = guard.packed
        # room for any data a peer's message may carry, so none is ever truncated
        received = self._received
        requests = [transport.irecv(received[peer], peer, SIGNATURE_TAG) for peer in self._peers]
        requests += [transport.isend(guard.message(peer), peer, SIGNATURE_TAG) for peer in self._peers]
        call.wait(requests, "signature", self._exchange)
        heads = self._heads
        for peer in self._peers:
            if heads[peer].tobytes() != mine:  # as bytes: see _compare_posted
                break
        else:
            return
        heads[self._rank][:] = mine
        signature = replace(guard.signature, sequence=sequence)
        error = disagreement(signature, [bytes(head) for head in heads], self._rank)
        if error is not None:
            raise error

    def _compare_posted(self, shared: SharedMemory, guard: Guard, sequence: int) -> None:
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
            self._on_mismatch()
            raise error

    def _write(self, line: str) -> None:
        if self.debug_file is None:
            print(line, file=sys.stderr, flush=True)
            return
        # opened per line, so nothing is left open however the program ends
        with open(self.debug_file.replace("{rank}", str(self.transport.rank)), "a") as file:
            file.write(line + "\n")
