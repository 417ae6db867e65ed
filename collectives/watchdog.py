"""Each collective's guard: agreed signature, bounded waits, a flight recorder and a debug log.

A :class:`Watchdog` belongs to one communicator. Around every collective it

- numbers the call (its sequence number on the communicator);
- unless checking is off, exchanges a :class:`~collectives.signature.Signature`
  with every other rank (one fixed-size message each way, on its own tag) and
  raises :class:`~collectives.errors.MismatchError` on every rank if they differ;
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
    "RECORDER_ENV",
    "SIGNATURE_TAG",
    "STALL_WARNING_ENV",
    "TIMEOUT_ENV",
    "Call",
    "Watchdog",
]

import logging
import math
import os
import sys
import time
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import CollectiveTimeout, ConfigurationError, TransportError
from .signature import SIGNATURE_BYTES, Signature, disagreement
from .transport.base import Request, SharedMemory, Transport

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

_log = logging.getLogger("collectives")


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
    text = os.environ.get(env, "").strip().lower()
    if not text:
        return default
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigurationError(f"{env}={text!r} is neither 1 nor 0")


@dataclass
class _Record:
    """One call in the flight recorder."""

    signature: Signature
    started: float  # time.time(), for comparing ranks' logs
    algorithm: str
    seconds: float | None = None
    outcome: str = "running"

    def line(self, rank: int) -> str:
        s = self.signature
        took = "-" if self.seconds is None else f"{self.seconds * 1e3:.3f}ms"
        clock = (
            time.strftime("%H:%M:%S", time.localtime(self.started)) + f".{int(self.started % 1 * 1e6):06d}"
        )
        return (
            f"collectives rank {rank} #{s.sequence} {s.collective} count={s.count} "
            f"dtype={s.dtype or '-'} op={s.op or '-'} root={'-' if s.root < 0 else s.root} "
            f"algorithm={self.algorithm} start={clock} time={took} {self.outcome}"
        )


class _Tracked:
    """A request with the peer it waits on, and whether it sends."""

    __slots__ = ("peer", "request", "sends")

    def __init__(self, request: Request, peer: int, sends: bool) -> None:
        self.request = request
        self.peer = peer
        self.sends = sends


class _WatchedTransport(Transport):
    """The transport the executor gets: each ``waitall`` is one step, bounded by the call's deadline.

    ``inner`` is the communicator's transport, or one over a subgroup of its ranks
    (a rail between nodes), whose rank ``i`` is the communicator's ``ranks[i]``.
    """

    def __init__(self, call: "Call", inner: Transport, ranks: tuple[int, ...] | None = None) -> None:
        self._call = call
        self._inner = inner
        self._ranks = ranks
        self._steps = 0

    @property
    def rank(self) -> int:
        return self._inner.rank

    @property
    def size(self) -> int:
        return self._inner.size

    def _peer(self, peer: int) -> int:
        return peer if self._ranks is None else self._ranks[peer]

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return _Tracked(self._inner.isend(buffer, dst, tag), self._peer(dst), True)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return _Tracked(self._inner.irecv(buffer, src, tag), self._peer(src), False)

    def waitall(self, requests: list[Request]) -> None:
        step = self._steps
        self._steps += 1
        self._call.wait(requests, step, self._inner)


class Call:
    """One collective in progress: the transport to run it on, and its deadlines.

    Attributes:
        algorithm: the algorithm that runs, once chosen (the recorder shows it).
        transport: the transport to give the executor.
    """

    def __init__(self, watchdog: "Watchdog", record: _Record) -> None:
        self.watchdog = watchdog
        self._record = record
        self._started = time.monotonic()
        self._deadline = self._started + watchdog.timeout
        self._warn_at = self._started + watchdog.stall_warning
        self._warned = False
        self._barriers = 0
        watched = math.isfinite(watchdog.timeout) or math.isfinite(watchdog.stall_warning)
        self._watched = watched
        self.transport: Transport = self.watch(watchdog.transport)

    @property
    def algorithm(self) -> str:
        return self._record.algorithm

    @algorithm.setter
    def algorithm(self, name: str) -> None:
        self._record.algorithm = name

    def run_on(self, transport: Transport) -> None:
        """Send the collective's messages over ``transport``, e.g. a device transport over the communicator's.

        The signature check has already used the communicator's own transport.
        """
        self.transport = self.watch(transport)

    def watch(self, inner: Transport, ranks: tuple[int, ...] | None = None) -> Transport:
        """``inner`` with its waits bounded by this call's deadline; its rank ``i`` is ``ranks[i]`` here."""
        return _WatchedTransport(self, inner, ranks) if self._watched else inner

    def wait(self, requests: list[_Tracked], step: int | str, transport: Transport | None = None) -> None:
        """Wait for ``requests`` (of ``transport``, the communicator's by default) until the deadline.

        Warns once at the stall interval.
        """
        transport = self.watchdog.transport if transport is None else transport
        inner = [t.request for t in requests]
        if not self._watched:  # neither a deadline nor a warning
            transport.waitall(inner)
            return
        if not self._warned:
            pending = transport.wait_for(inner, max(self._warn_at - time.monotonic(), 0.0))
            if not pending:
                return
            self._warned = True
            requests = [requests[i] for i in pending]
            inner = [t.request for t in requests]
            _log.warning(
                "rank %d: %s #%d has waited %.3g s %s for %s",
                transport.rank,
                self._record.signature.collective,
                self._record.signature.sequence,
                time.monotonic() - self._started,
                "to start" if step == "signature" else f"in step {step}",
                _ranks(t.peer for t in requests),
            )
        pending = transport.wait_for(inner, max(self._deadline - time.monotonic(), 0.0))
        if pending:
            self._time_out([requests[i] for i in pending], step, transport)

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        """Pass the next barrier of ``shared``, leaving ``note``, by the deadline; warn at the stall interval.

        ``shared``'s rank ``i`` is this communicator's ``ranks[i]`` (all of them, in order, by default).
        """
        step = f"barrier {self._barriers}"
        self._barriers += 1
        shared.arrive(note)
        if not self._warned:
            missing = shared.wait(max(self._warn_at - time.monotonic(), 0.0))
            if not missing:
                return
            self._warned = True
            _log.warning(
                "rank %d: %s #%d has waited %.3g s in %s for %s",
                self.watchdog.transport.rank,
                self._record.signature.collective,
                self._record.signature.sequence,
                time.monotonic() - self._started,
                step,
                _ranks(tuple(missing if ranks is None else [ranks[r] for r in missing])),
            )
        missing = shared.wait(max(self._deadline - time.monotonic(), 0.0))
        if missing:
            shared.abandon()
            self._fail(tuple(missing if ranks is None else [ranks[r] for r in missing]), step)

    def _time_out(self, stuck: list[_Tracked], step: int | str, transport: Transport) -> None:
        watchdog = self.watchdog
        peers = tuple(sorted({t.peer for t in stuck}))
        # MPI cannot cancel the sends: keep their buffers alive, and the communicator out of use
        watchdog.abandoned.extend(stuck)
        transport.abandon([t.request for t in stuck if not t.sends], [t.request for t in stuck if t.sends])
        self._fail(peers, step)

    def _fail(self, peers: tuple[int, ...], step: int | str) -> None:
        watchdog, s = self.watchdog, self._record.signature
        self._record.outcome = "timed out"
        where = "before it started" if step == "signature" else f"in {step}"
        if isinstance(step, int):
            where = f"in step {step}"
        message = (
            f"rank {watchdog.transport.rank}: {s.collective} #{s.sequence} did not complete in "
            f"{watchdog.timeout:g} s; stuck {where} waiting for {_ranks(peers)}; "
            "this communicator is unusable now"
        )
        watchdog.broken = message
        raise CollectiveTimeout(
            f"{message}\n{watchdog.flight_record_text()}",
            collective=s.collective,
            sequence=s.sequence,
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
        self.recorder: deque[_Record] = deque(maxlen=int(kept) if kept else _DEFAULT_RECORDED)
        self.sequence = 0
        self.broken: str | None = None
        self.abandoned: list[_Tracked] = []

    def flight_record(self) -> list[str]:
        """The recorded calls, oldest first, one line each."""
        return [record.line(self.transport.rank) for record in self.recorder]

    def flight_record_text(self) -> str:
        lines = self.flight_record()
        return f"last {len(lines)} collectives on rank {self.transport.rank}:\n  " + "\n  ".join(lines)

    @contextmanager
    def collective(
        self,
        collective: str,
        algorithm: str,
        count: int,
        dtype: str = "",
        op: str = "",
        root: int = -1,
        counts: tuple[int, ...] | None = None,
        check: bool | None = None,
    ) -> Iterator[Call]:
        """Number, check, bound and record one collective run in the ``with`` block.

        Raises:
            MismatchError: on every rank, when their calls differ.
            CollectiveTimeout: the call did not complete in time.
            TransportError: an earlier call timed out, so this communicator is unusable.
        """
        if self.broken is not None:
            raise TransportError(
                f"an earlier collective timed out, so this communicator is unusable: {self.broken}"
            )
        signature = Signature(self.sequence, collective, algorithm, dtype, op, root, count, counts)
        self.sequence += 1
        record = _Record(signature, time.time(), algorithm)
        self.recorder.append(record)
        call = Call(self, record)
        try:
            if self.check if check is None else check:
                self._agree(call, signature)
            yield call
        except BaseException as error:
            record.outcome = f"failed: {type(error).__name__}"
            raise
        else:
            record.outcome = "ok"
        finally:
            record.seconds = time.monotonic() - call._started
            if self.debug:
                self._write(record.line(self.transport.rank))

    def _agree(self, call: Call, signature: Signature) -> None:
        """Exchange signatures with every other rank; raise on every rank if any differ."""
        transport = self.transport
        mine = signature.pack()
        size, rank = transport.size, transport.rank
        if size == 1:
            return
        received = [bytearray(SIGNATURE_BYTES) for _ in range(size)]
        requests = []
        for peer in range(size):
            if peer != rank:
                requests.append(_Tracked(transport.irecv(received[peer], peer, SIGNATURE_TAG), peer, False))
        for peer in range(size):
            if peer != rank:
                requests.append(_Tracked(transport.isend(mine, peer, SIGNATURE_TAG), peer, True))
        call.wait(requests, "signature")
        received[rank][:] = mine
        error = disagreement(signature, [bytes(r) for r in received], rank)
        if error is not None:
            raise error

    def _write(self, line: str) -> None:
        if self.debug_file is None:
            print(line, file=sys.stderr, flush=True)
            return
        # opened per line, so nothing is left open however the program ends
        with open(self.debug_file.replace("{rank}", str(self.transport.rank)), "a") as file:
            file.write(line + "\n")
