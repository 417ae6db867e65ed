"""One collective under its watchdog: the transport it runs on, its deadlines, its flight-recorder entry."""

__all__ = [
    "NOTICE",
    "Call",
    "Owner",
    "Posted",
    "Starts",
    "SteppedCall",
    "Tracked",
    "WatchedTransport",
    "heard_of_break",
]

import logging
import struct
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any, Protocol

from .errors import BrokenCommunicatorError, CollectiveTimeout, PeerFailedError, TransportError
from .faults import PLAN as _FAULTS
from .signature import Signature
from .transport.base import Request, SharedMemory, Transport, WrappedTransport
from .transport.tags import Tag

_log = logging.getLogger("collectives")

_NOTICE_POLL_S = 0.02  # a wait looks for another rank's Tag.BROKEN notice this often
NOTICE = struct.Struct("<qq64s")  # Tag.BROKEN: the rank that broke, its call's number, why


class Posted(Protocol):
    """A signature posted with a call's first barrier (:class:`~collectives.agreement.PackedSignature`)."""

    packed: bytearray
    signature: Signature


class Owner(Protocol):
    """What a call needs of the watchdog that opened it (:class:`~collectives.watchdog.Watchdog`)."""

    transport: Transport
    timeout: float
    stall_warning: float
    watched: "WatchedTransport | None"
    shared: SharedMemory | None
    abandoned: list["Tracked"]
    broken: str | None

    def end(self, call: "Call", error: BaseException | None = None) -> None: ...

    def break_off(self, why: str, rank: int | None = None) -> None: ...

    def tell_timed_out(self, why: str) -> None: ...

    def compare_posted(self, shared: SharedMemory, guard: Posted, sequence: int) -> None: ...

    def flight_record_text(self) -> str: ...


class Tracked:
    """A request with the peer it waits on, and whether it sends."""

    __slots__ = ("peer", "request", "sends")

    def __init__(self, request: Request, peer: int, sends: bool) -> None:
        self.request = request
        self.peer = peer
        self.sends = sends


class WatchedTransport(WrappedTransport):
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
        return Tracked(self._inner.isend(buffer, dst, tag), self._peer(dst), True)

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return Tracked(self._inner.irecv(buffer, src, tag), self._peer(src), False)

    def waitall(self, requests: list[Request]) -> None:
        step = self.steps
        self.steps += 1
        call = self.call
        if call is None:
            raise TransportError("a watched transport was used outside its collective")
        call.wait([t.request for t in requests], step, requests, self._inner)


class Call:
    """One collective: the transport to run it on and its deadlines, then its entry in the flight recorder.

    :meth:`Watchdog.watch <collectives.watchdog.Watchdog.watch>` opens one for a
    ``with`` block, which ends it (:meth:`Watchdog.end <collectives.watchdog.Watchdog.end>`)
    with whatever error leaves the block.

    Attributes:
        signature: the call's fields; its own sequence number is ``sequence``.
        sequence: the call's number on its communicator.
        algorithm: the algorithm that runs, once chosen (the recorder shows it).
        transport: the transport to give the executor.
        outcome: ``"running"``, then ``"ok"``, ``"timed out"`` or ``"failed: ..."``.
        seconds: how long the call took, once it ended.
        began: when the call began, by ``time.monotonic()``.
        pending: a signature to post with the call's first barrier and check after it.
        keeps: what the call's messages may write into: kept alive if it breaks the communicator.
    """

    __slots__ = (
        "_barriers",
        "_deadline",
        "_warn_at",
        "_warned",
        "_watched",
        "algorithm",
        "began",
        "keeps",
        "outcome",
        "pending",
        "seconds",
        "sequence",
        "signature",
        "started",
        "transport",
        "watchdog",
    )

    def __init__(self, watchdog: Owner, signature: Signature, sequence: int) -> None:
        # one object per call, its own record too: a small allreduce takes a few microseconds
        self.watchdog = watchdog
        self.signature = signature
        self.sequence = sequence
        self.algorithm = signature.algorithm
        self.started = time.time()  # for comparing ranks' logs
        self.seconds: float | None = None
        self.outcome = "running"
        self.began = started = time.monotonic()  # for the deadlines
        self._deadline = started + watchdog.timeout
        self._warn_at = started + watchdog.stall_warning
        self._warned = False
        self._barriers = 0
        self.pending: Posted | None = None  # a signature to post with the first barrier and check after it
        self.keeps: object = None
        watched = watchdog.watched
        self._watched = watched is not None
        if watched is None:
            self.transport: Transport = watchdog.transport
        else:
            watched.call = self
            watched.steps = 0
            self.transport = watched

    def __enter__(self) -> "Call":
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.watchdog.end(self, error)

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
        watched = WatchedTransport(inner, ranks)
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
            try:
                transport.waitall(requests)
            except BrokenCommunicatorError:
                raise
            except TransportError as error:
                self._peer_failed(error, step, peers)
            return
        try:
            # the first slice as the old single wait: most waits end in it, with no more work than before
            until = self._deadline if self._warned else min(self._warn_at, self._deadline)
            pending = transport.wait_for(requests, max(min(until - time.monotonic(), _NOTICE_POLL_S), 0.0))
            while pending:
                requests = [requests[i] for i in pending]
                peers = [peers[i] for i in pending]
                self._heard_of_break(requests, peers, transport)
                now = time.monotonic()
                if now >= self._deadline:
                    stuck = [Tracked(r, p.peer, p.sends) for r, p in zip(requests, peers, strict=True)]
                    self._time_out(stuck, step, transport)
                if not self._warned and now >= self._warn_at:
                    self._warned = True
                    self._warn(step, (p.peer for p in peers), transport.rank)
                until = self._deadline if self._warned else min(self._warn_at, self._deadline)
                pending = transport.wait_for(requests, max(min(until - now, _NOTICE_POLL_S), 0.0))
        except (BrokenCommunicatorError, CollectiveTimeout):
            raise
        except TransportError as error:
            self._peer_failed(error, step, peers)

    def exchange(
        self,
        transport: Transport,
        sends: list[tuple[Any, int]],
        receives: list[tuple[Any, int]],
        tag: int,
        step: str,
    ) -> None:
        """Send and receive ``(buffer, peer)`` messages of ``tag``, waiting no longer than the call may.

        A timeout names ``step`` as where the call was stuck.
        """
        requests = [transport.irecv(buffer, peer, tag) for buffer, peer in receives]
        requests += [transport.isend(buffer, peer, tag) for buffer, peer in sends]
        peers = [Tracked(None, peer, False) for _, peer in receives] + [
            Tracked(None, peer, True) for _, peer in sends
        ]
        self.wait(requests, step, peers, transport)

    def _warn(self, step: int | str, peers: Iterator[int], rank: int) -> None:
        _log.warning(
            "rank %d: %s #%d has waited %.3g s %s for %s",
            rank,
            self.signature.collective,
            self.sequence,
            time.monotonic() - self.began,
            "to start"
            if step == "signature"
            else f"in step {step}"
            if isinstance(step, int)
            else f"in {step}",
            _ranks(peers),
        )

    def _heard_of_break(self, requests: list[Request], peers: Sequence[Any], transport: Transport) -> None:
        """Raise if another rank broke the communicator (a Tag.BROKEN notice, or a mark in shared memory)."""
        watchdog = self.watchdog
        shared = watchdog.shared
        by = shared.broken_by() if shared is not None else None
        if by is None:
            told = _notice(watchdog.transport, 0.0)
            if told is None:
                return
            by, why = told
        else:
            why = _why(watchdog.transport, by)
        # the broken rank's messages will not come: leave the receives posted, keep the sends alive
        stuck = [Tracked(r, p.peer, p.sends) for r, p in zip(requests, peers, strict=True)]
        watchdog.abandoned.extend(stuck)
        transport.abandon([], [t.request for t in stuck if t.sends])
        self.outcome = "broken"
        watchdog.break_off(why, by)
        raise BrokenCommunicatorError(
            f"rank {watchdog.transport.rank}: {self.signature.collective} #{self.sequence} cannot complete: "
            f"rank {by} broke the communicator ({why}); this communicator is unusable now",
            rank=by,
        )

    def _peer_failed(self, error: TransportError, step: int | str, peers: Sequence[Any]) -> None:
        watchdog = self.watchdog
        named = tuple(sorted({p.peer for p in peers}))
        where = f"step {step}" if isinstance(step, int) else step
        what = f"{self.signature.collective} #{self.sequence}"
        message = f"{what} failed in {where} with {_ranks(named) if named else 'no peer named'}: {error}"
        watchdog.break_off(message)
        raise PeerFailedError(
            f"rank {watchdog.transport.rank}: {message}; this communicator is unusable now",
            collective=self.signature.collective,
            sequence=self.sequence,
            peers=named,
            rank=watchdog.transport.rank,
        ) from error

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        """Pass the next barrier of ``shared``, leaving ``note``, by the deadline; warn at the stall interval.

        ``shared``'s rank ``i`` is this communicator's ``ranks[i]`` (all of them, in order, by default).
        """
        passed = self._barriers
        self._barriers = passed + 1
        pending = self.pending
        if pending is not None:
            shared.post(pending.packed)
        shared.arrive(note)
        if not self._warned:  # the common case inline: every rank there before the stall interval
            missing = shared.wait(max(min(self._warn_at, self._deadline) - time.monotonic(), 0.0))
            if not missing:
                if pending is not None:
                    self.pending = None
                    self.watchdog.compare_posted(shared, pending, self.sequence)
                return
            self.arrived(shared, passed, ranks, missing)
        else:
            self.arrived(shared, passed, ranks)

    def arrived(
        self,
        shared: SharedMemory,
        passed: int = 0,
        ranks: tuple[int, ...] | None = None,
        missing: list[int] | None = None,
    ) -> None:
        """The waiting half of :meth:`barrier`: this rank has arrived at barrier number ``passed``.

        For a caller that arrives by itself and waits here only when its peers were
        not all there at once (a persistent call's start, :mod:`collectives.persistent`).
        ``missing``: the ranks a wait to the stall interval already found missing (then not waited again).
        """
        pending = self.pending
        if not self._warned:
            if missing is None:
                missing = shared.wait(max(min(self._warn_at, self._deadline) - time.monotonic(), 0.0))
            if missing and shared.broken_by() is not None:
                missing = self._barrier_broken(shared, missing, ranks)
            if not missing:
                if pending is not None:
                    self.pending = None
                    self.watchdog.compare_posted(shared, pending, self.sequence)
                return
            self._warned = True
            if time.monotonic() >= self._deadline:
                missing = shared.wait(0.0)
                if missing:
                    shared.abandon()
                    self._fail(
                        tuple(missing if ranks is None else [ranks[r] for r in missing]), f"barrier {passed}"
                    )
            _log.warning(
                "rank %d: %s #%d has waited %.3g s in %s for %s",
                self.watchdog.transport.rank,
                self.signature.collective,
                self.sequence,
                time.monotonic() - self.began,
                f"barrier {passed}",
                _ranks(tuple(missing if ranks is None else [ranks[r] for r in missing])),
            )
        missing = shared.wait(max(self._deadline - time.monotonic(), 0.0))
        if missing and shared.broken_by() is not None:
            missing = self._barrier_broken(shared, missing, ranks)
        if missing:
            shared.abandon()
            self._fail(tuple(missing if ranks is None else [ranks[r] for r in missing]), f"barrier {passed}")
        if pending is not None:
            self.pending = None
            self.watchdog.compare_posted(shared, pending, self.sequence)

    def _barrier_broken(
        self, shared: SharedMemory, missing: list[int], ranks: tuple[int, ...] | None
    ) -> list[int]:
        """A barrier another rank broke off: raise naming it, unless everyone arrived meanwhile."""
        missing = shared.wait(0.0)
        by = shared.broken_by()  # a rank of the communicator, as the watchdog marks it
        if not missing or by is None:
            return missing
        watchdog = self.watchdog
        self.outcome = "broken"
        why = _why(watchdog.transport, by)
        watchdog.break_off(why, by)
        raise BrokenCommunicatorError(
            f"rank {watchdog.transport.rank}: {self.signature.collective} #{self.sequence} cannot complete: "
            f"rank {by} broke the communicator ({why}); this communicator is unusable now",
            rank=by,
        )

    def _time_out(self, stuck: list[Tracked], step: int | str, transport: Transport) -> None:
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
            f"rank {watchdog.transport.rank}: {collective} #{sequence} timed out after "
            f"{watchdog.timeout:g} s; stuck {where} waiting for {_ranks(peers)}; "
            "this communicator is unusable now"
        )
        # the ranks that come late learn of it before their call returns (Watchdog.end); those
        # waiting time out on their own, naming whom they wait for
        watchdog.tell_timed_out(f"{collective} #{sequence} timed out waiting for {_ranks(peers)}")
        watchdog.broken = message
        raise CollectiveTimeout(
            f"{message}\n{watchdog.flight_record_text()}",
            collective=collective,
            sequence=sequence,
            step=step,
            peers=peers,
        )


class Starts:
    """One flight-recorder entry for a persistent call's lean starts in a row: the first, the last, how many.

    A start appends a new entry only where another call came since the last one's,
    so the recorder stays in program order for a few nanoseconds a start.
    """

    __slots__ = ("algorithm", "first", "last", "outcome", "signature", "started", "starts")

    def __init__(self, signature: Signature, sequence: int, algorithm: str) -> None:
        self.signature = signature
        self.algorithm = algorithm
        self.first = self.last = sequence
        self.starts = 1
        self.started = time.time()
        self.outcome = "ok"

    def line(self, rank: int) -> str:
        """The starts as the flight recorder shows them."""
        s = self.signature
        clock = (
            time.strftime("%H:%M:%S", time.localtime(self.started)) + f".{int(self.started % 1 * 1e6):06d}"
        )
        numbers = f"#{self.first}" if self.first == self.last else f"#{self.first}-#{self.last}"
        return (
            f"collectives rank {rank} {numbers} {s.collective} count={s.count} "
            f"dtype={s.dtype or '-'} op={s.op or '-'} root={'-' if s.root < 0 else s.root} "
            f"algorithm={self.algorithm} start={clock} persistent starts={self.starts} {self.outcome}"
        )


class SteppedCall(Call):
    """A call that an injected fault fails mid-way (see :mod:`collectives.faults`): it counts its waits.

    Only such a call becomes one (its class is swapped as it opens), so no other call pays for counting.
    """

    __slots__ = ()

    def wait(self, requests: list[Request], step: int | str, *where: Any) -> None:
        """As :meth:`Call.wait` (``where``: its peers and transport), a step counted first."""
        if isinstance(step, int):  # a schedule's step, its messages posted; not the signature check
            _FAULTS.stepped(self.watchdog.transport.rank, self)
        super().wait(requests, step, *where)

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        _FAULTS.stepped(self.watchdog.transport.rank, self)
        super().barrier(shared, note, ranks)


def _ranks(peers: Iterator[int] | tuple[int, ...]) -> str:
    ranks = sorted(set(peers))
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


_NOTICE_WAIT_S = 0.1  # a mark in shared memory goes first; its rank's notice says why, moments later


def heard_of_break(watchdog: Owner) -> tuple[int, str] | None:
    """Who broke the communicator or timed out, and why, by a mark in shared memory or a notice; or None."""
    shared, transport = watchdog.shared, watchdog.transport
    if shared is not None:
        by = shared.broken_by()
        if by is not None:
            return by, _why(transport, by)
        by = shared.timed_out_by()
        if by is not None:
            told = _notice(transport, _NOTICE_WAIT_S, Tag.TIMED_OUT)
            return by, told[1] if told is not None else "its call timed out"
    return _notice(transport, 0.0) or _notice(transport, 0.0, Tag.TIMED_OUT)


def _notice(transport: Transport, timeout: float, tag: int = Tag.BROKEN) -> tuple[int, str] | None:
    """A notice waiting for this rank (Tag.BROKEN, or ``tag``): the rank it names, and why."""
    try:
        found = transport.probe(tag, timeout)
    except NotImplementedError:
        return None
    if found is None:
        return None
    notice = bytearray(NOTICE.size)
    transport.waitall([transport.irecv(notice, found[0], tag)])
    by, _, told = NOTICE.unpack(notice)
    return by, told.rstrip(b"\0").decode(errors="replace")


def _why(transport: Transport, by: int) -> str:
    """Why rank ``by`` broke the communicator, as its notice says; its error tells otherwise."""
    told = _notice(transport, _NOTICE_WAIT_S)
    return told[1] if told is not None and told[0] == by else "its call did not finish; see its error"
