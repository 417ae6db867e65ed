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

The concerns live beside it: the settings in :mod:`collectives.watch_settings`,
the signatures' exchange and comparison in :mod:`collectives.agreement`, the
flight recorder and debug log in :mod:`collectives.flight_recorder`, a call's
deadlines in :mod:`collectives.call`; the watchdog puts them together.

MPI cannot cancel a send in general, so after a timeout the messages in flight
stay posted and the communicator refuses further collectives; make a new one.
The timeout tells the other ranks, and a rank that comes to the call late learns
of it before its call returns (:meth:`Watchdog.end`). A call that ends on any
other error than the ranks' agreed ones (a ``KeyboardInterrupt`` or a signal
handler's exception anywhere from the public function's first line to its
return: :meth:`Watchdog.escaped`, an MPI failure) breaks the communicator too,
and this rank tells the others (a message on
:attr:`~collectives.transport.tags.Tag.BROKEN`, and a mark in the shared memory),
whose next wait raises :class:`~collectives.errors.BrokenCommunicatorError` naming
it. One call runs at a time: a second thread's call while one runs raises
:class:`~collectives.errors.ConcurrentCallError` and breaks the communicator.
"""

__all__ = [
    "CHECK_ENV",
    "DEBUG_ENV",
    "DEBUG_FILE_ENV",
    "DEFAULT_STALL_WARNING_S",
    "DEFAULT_TIMEOUT_S",
    "FUSED_BYTES",
    "RECORDER_ENV",
    "STALL_WARNING_ENV",
    "TIMEOUT_ENV",
    "PackedSignature",
    "Watchdog",
]

import contextlib
import math
import threading
import time
from collections.abc import Callable

from .agreement import FUSED_BYTES, Agreement, PackedSignature
from .call import NOTICE, Call, SteppedCall, Tracked, WatchedTransport, heard_of_break
from .engine import WatchdogCore
from .errors import (
    BrokenCommunicatorError,
    CollectivesError,
    ConcurrentCallError,
    FreedCommunicatorError,
    MismatchError,
    PeerFailedError,
    PeerInputError,
    TransportError,
)
from .faults import PLAN as _FAULTS
from .flight_recorder import new_recorder, record_lines, record_text, write_debug_line
from .signature import SIGNATURE_BYTES, Signature, problem_of
from .tracing.recorder import TRACER as _TRACE
from .tracing.recorder import number_of
from .tracing.steps import TracedCall
from .transport.base import SharedMemory, Transport
from .transport.tags import Tag
from .watch_settings import (
    CHECK_ENV,
    DEBUG_ENV,
    DEBUG_FILE_ENV,
    DEFAULT_STALL_WARNING_S,
    DEFAULT_TIMEOUT_S,
    RECORDER_ENV,
    STALL_WARNING_ENV,
    TIMEOUT_ENV,
    debug_file,
    flag,
    seconds,
)


def _nothing() -> None:
    """What a watchdog does on a mismatch unless told otherwise."""


_get_ident = threading.get_ident


def _thread_name(ident: int) -> str:
    thread = next((t for t in threading.enumerate() if t.ident == ident), None)
    return f"thread {thread.name!r}" if thread is not None else f"thread {ident}"


class Watchdog(WatchdogCore):
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
        self.timeout = seconds(timeout, TIMEOUT_ENV, DEFAULT_TIMEOUT_S)
        self.stall_warning = seconds(
            stall_warning, STALL_WARNING_ENV, min(DEFAULT_STALL_WARNING_S, self.timeout / 2)
        )
        self.check = flag(check, CHECK_ENV, True)
        self.debug = flag(None, DEBUG_ENV, False)
        self.debug_file = debug_file(transport.rank)
        self.recorder = new_recorder()
        self.number = number_of(self)  # the communicator's number in this process, as traces name it
        self.sequence = 0
        # when the last call began; a call ending half a timeout or more after it asks whether a
        # peer timed out on it meanwhile (see end), which no quicker call can meet
        self.last_began = time.monotonic()
        self.late_after = self.timeout / 2
        self.broken: str | None = None
        self.broken_by: int | None = None  # the rank where it broke
        self.freed = False
        self.ended: BaseException | None = None  # the last error a call ended with here (see escaped)
        self.abandoned: list[Tracked] = []
        # the arrays of calls that broke the communicator: receives posted into them may still land
        self.kept: list[object] = []
        self._notices: list[tuple[object, bytearray]] = []  # the Tag.BROKEN sends, kept alive
        super().__init__()  # the claim of the communicator (WatchdogCore's; see claim)
        self.claimed_by = 0
        """The thread holding the claim (0: none); it only names that thread in errors."""
        watched = math.isfinite(self.timeout) or math.isfinite(self.stall_warning)
        self.watched = WatchedTransport(transport) if watched else None
        self._rank, self._size = transport.rank, transport.size
        self._peers = [peer for peer in range(self._size) if peer != self._rank]
        # the signature exchange's buffers, the same for every call; its methods bound once, for the hot path
        self.agreement = agreement = Agreement(transport)
        self._exchange = agreement.exchange
        self.arrived = agreement.arrived
        self.compare_posted = agreement.compare_posted
        self.shared: SharedMemory | None = None
        # what the next calls are of, set by a layer above (the key-value store's key): in every signature
        self.tag = b""

    def agree_through(self, shared: SharedMemory, on_mismatch: Callable[[], None] = _nothing) -> None:
        """Agree on signatures through ``shared`` (over every rank, in order) from the next call on.

        Each call posts its signature for a barrier of ``shared`` and reads the
        others' after it, in place of messages: cheaper, and the shared-memory
        executor's first barrier can carry it (see :meth:`watch`). Collective: every
        rank must switch before the same call. ``on_mismatch`` runs on every rank
        whose call found the signatures different, before the error is raised.
        """
        if shared.MESSAGE_BYTES >= SIGNATURE_BYTES and self._size > 1:
            self.shared = shared
            self.agreement.on_mismatch = on_mismatch

    def flight_record(self) -> list[str]:
        """The recorded calls, oldest first, one line each."""
        return record_lines(self.recorder, self._rank)

    def flight_record_text(self) -> str:
        """The recorded calls under a heading naming this rank, as a timeout's error shows them."""
        return record_text(self.recorder, self._rank)

    def signature_of(
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
    ) -> PackedSignature:
        """The packed signature of a call; keep it to open repeated calls with (see :meth:`watch`).

        ``payloads`` gives, per peer, the bytes of data that travel with the signature.
        """
        signature = Signature(0, collective, algorithm, dtype, op, root, count, counts, backend)
        return PackedSignature(signature, payloads)

    def claim(self, collective: str) -> None:
        """Make this thread's call the one running on the communicator, before it touches anything shared.

        Release it with :meth:`release`, or pass ``claimed=True`` to :meth:`watch`,
        whose :meth:`end` releases it.

        Raises:
            ConcurrentCallError: another thread's call holds it (the communicator is broken then).
            BrokenCommunicatorError: the communicator is unusable already.
        """
        if self.broken is not None:
            self._refuse()
        if not self.take_claim():
            self._concurrent(collective)
        self.claimed_by = _get_ident()

    def release(self) -> None:
        """Give up a :meth:`claim` whose call ends before :meth:`watch` (its preparation raised)."""
        self.claimed_by = 0
        self.give_claim()

    def watch(
        self, guard: PackedSignature, check: bool | None = None, *, first_barrier: bool = False,
        claimed: bool = False, keeps: object = None,
    ) -> Call:  # fmt: skip
        """Claim the communicator; number, record and (unless ``check`` is off) check the call of ``guard``.

        The one way a call runs under the watchdog: it ends with the ``with`` block it
        opens (``with watchdog.watch(guard) as call:``), or with :meth:`end`, which
        must follow otherwise; either gives the claim back. (The lean path,
        :mod:`collectives.lean`, writes the same steps out for its hot loop.)

        With ``first_barrier``, where signatures go through shared memory (see
        :meth:`agree_through`), the call's first :meth:`Call.barrier` on that memory
        carries and checks the signature: the caller promises that the call does
        nothing another rank can see before it. Otherwise the check is done here.
        With ``claimed``, the caller holds the communicator's :meth:`claim` already.
        ``keeps``: what the call's messages may still write into if it breaks the
        communicator (its arrays): kept alive then, in :attr:`kept`.

        Raises:
            MismatchError: on every rank, when their calls differ.
            CollectiveTimeout: the ranks did not all start the call in time.
            TransportError: an earlier call timed out, so this communicator is unusable.
        """
        if not claimed:
            self.claim(guard.signature.collective)
        elif self.broken is not None:
            self.release()
            self._refuse()
        sequence = self.sequence
        self.sequence = sequence + 1
        call = Call(self, guard.signature, sequence)
        call.keeps = keeps
        self.recorder.append(call)
        if _TRACE.steps:  # its barriers and signature wait recorded (see collectives.tracing.steps)
            call.__class__ = TracedCall
        if _FAULTS.armed:  # $COLLECTIVES_FAULT: see collectives.faults
            self._inject(call)
        if (self.check if check is None else check) and self._size > 1:
            try:
                guard.stamp(sequence, self.tag)
                shared = self.shared
                if shared is None:
                    self._exchange(call, guard, sequence)
                else:  # posted with a barrier of the shared memory: the call's first, or one here
                    call.pending = guard
                    if not first_barrier:
                        call.barrier(shared)
            except BaseException as error:
                self.end(call, error)
                raise
        return call

    def _inject(self, call: Call) -> None:
        try:
            if _FAULTS.reached(self._rank, f"{call.signature.collective} #{call.sequence}", call=call):
                call.__class__ = SteppedCall  # the fault is due at one of its steps: count them
        except BaseException as error:
            self.end(call, error)
            raise

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
        try:
            self.claim(collective)
        except BrokenCommunicatorError as refused:  # another thread's call runs: this one must not send
            error.add_note(str(refused))
            return
        sequence = self.sequence
        self.sequence = sequence + 1
        signature = Signature(0, collective, str(algorithm), problem=problem_of(error))
        call = Call(self, signature, sequence)
        self.recorder.append(call)
        if _FAULTS.armed:  # counted as every call the watchdog numbers
            self._inject(call)
        try:
            if (self.check if check is None else check) and self._size > 1:
                self._agree(call, PackedSignature(signature), sequence)
        except PeerInputError as others:
            # every rank's checks failed or the ranks were out of step too: say so beside this rank's own
            if set(others.problems) != {self._rank} or set(others.fields) != {"problem"}:
                error.add_note(f"rank {self._rank} told the other ranks; they say: {others}")
        except CollectivesError as failure:
            error.add_note(f"rank {self._rank} could not tell the other ranks: {failure}")
        finally:
            self.end(call, error)

    def end(self, call: Call, error: BaseException | None = None) -> None:
        """Record how ``call`` ended: ``error`` if it raised one.

        Raises:
            PeerFailedError: in place of MPI's own error, naming the call.
        """
        if call.pending is not None and error is None and self.shared is not None:
            # a call that promised a barrier and passed none still checks its signature
            try:
                call.barrier(self.shared)
            except BaseException as failure:
                self.end(call, failure)
                raise
        now = time.monotonic()
        late = None
        if error is None and now - self.last_began >= self.late_after and self.broken is None:
            error = late = self._late(call.signature.collective, call.sequence)
        self.last_began = call.began
        call.outcome = "ok" if error is None else f"failed: {type(error).__name__}"
        if error is not None:
            self.ended = error
        call.seconds = now - call.began
        if self.watched is not None:
            self.watched.call = None
        self.claimed_by = 0
        self.give_claim()
        if self.debug:
            write_debug_line(self.debug_file, self._rank, call.line(self._rank))
        if _TRACE.on:
            _TRACE.ended(self, call, now)
        if late is not None:
            raise late
        if error is not None:
            try:
                self._ended_badly(call, error)
            finally:
                if call.keeps is not None and self.broken is not None:  # receives posted may still land
                    self.kept.append(call.keeps)

    def _ended_badly(self, call: Call, error: BaseException) -> None:
        """Break the communicator unless every rank raised ``error`` alike; name MPI's own errors."""
        if isinstance(error, MismatchError | BrokenCommunicatorError) or (
            isinstance(error, CollectivesError) and not isinstance(error, TransportError)
        ):
            return  # raised on every rank alike (a mismatch, a calibration ...), or broken already
        what = f"{call.signature.collective} #{call.sequence}"
        if type(error) is TransportError:  # MPI's own, from below the call's waits
            self.break_off(f"{what} failed: {error}")
            raise PeerFailedError(
                f"rank {self._rank}: {what} failed: {error}; this communicator is unusable now",
                collective=call.signature.collective,
                sequence=call.sequence,
                peers=(),
                rank=self._rank,
            ) from error
        if self.broken is None:
            self.break_off(f"{what} did not finish ({type(error).__name__})")

    def late(self, collective: str, sequence: int) -> None:
        """Raise if a peer broke the communicator while call ``sequence`` ran: a lean call's :meth:`end`.

        Raises:
            BrokenCommunicatorError: a peer timed out on the call, or broke the communicator otherwise.
        """
        if self.broken is None:
            error = self._late(collective, sequence)
            if error is not None:
                self.ended = error
                raise error

    def _late(self, collective: str, sequence: int) -> BrokenCommunicatorError | None:
        """The error of a call that ran to its end after a peer broke the communicator (a timeout), if any.

        A peer's call times out only a timeout after it began, and it began no
        earlier than this rank's call before; only a call ending that late asks.
        """
        heard = heard_of_break(self)
        if heard is None:
            return None
        by, why = heard
        self.break_off(why, by)
        return BrokenCommunicatorError(
            f"rank {self._rank}: {collective} #{sequence} cannot complete: "
            f"rank {by} broke the communicator ({why}); this communicator is unusable now",
            rank=by,
        )

    def escaped(self, collective: str, error: BaseException) -> None:
        """Account for ``error`` leaving a call of ``collective``: the boundary of every public call.

        An error this watchdog ended a call with was dealt with there (told,
        agreed, or the communicator broken), and the library's own errors raised
        outside a call are its checks, made before the call sends or counts
        anything. Any other (an interrupt or a signal handler's exception before
        the call was numbered or after it ended, an error between the claim and
        the call's ``try``) may have left this rank a call behind or ahead of its
        peers, whose next calls would pair with the wrong ones: it breaks the
        communicator on every rank, naming the error. A claim the call took and
        never gave back is released.
        """
        if self.claim_held() and self.claimed_by in (0, _get_ident()):
            self.claimed_by = 0
            self.give_claim()
        if error is self.ended or self.broken is not None or isinstance(error, CollectivesError):
            return
        why = f"{collective} interrupted ({type(error).__name__})"
        self.break_off(why)
        error.add_note(f"rank {self._rank}: {why}; this communicator is unusable now")

    def tell_timed_out(self, why: str) -> None:
        """Tell the other ranks that this rank's call timed out, for a late one to find before it returns.

        Unlike :meth:`break_off`, no wait of theirs ends on it: a rank waiting in the
        call times out on its own, naming whom it waits for.
        """
        if self.freed or self.broken is not None:
            return
        if self.shared is not None:
            self.shared.time_out()
        for peer in self._peers:
            notice = bytearray(NOTICE.pack(self._rank, self.sequence - 1, why.encode()[:64]))
            with contextlib.suppress(CollectivesError):  # a peer that cannot be told learns by its timeout
                self._notices.append((self.transport.isend(notice, peer, Tag.TIMED_OUT), notice))

    def break_off(self, why: str, rank: int | None = None) -> None:
        """Mark the communicator broken (by ``rank``, this one by default) and, if here, tell the others.

        Every later call raises :class:`~collectives.errors.BrokenCommunicatorError`
        on this rank; the others' next wait finds the notice and raises it too.
        """
        if self.broken is not None:
            return
        self.broken_by = self._rank if rank is None else rank
        self.broken = f"rank {self.broken_by} broke it: {why}"
        if self.freed:
            return
        self.transport.drain_at_exit()
        # tell every peer, also where this rank only heard of it: a peer may still wait on this one
        if self.shared is not None:
            self.shared.break_off(self.broken_by)
        for peer in self._peers:
            if peer == self.broken_by:
                continue
            notice = bytearray(NOTICE.pack(self.broken_by, self.sequence - 1, why.encode()[:64]))
            with contextlib.suppress(CollectivesError):  # a peer that cannot be told learns by its timeout
                self._notices.append((self.transport.isend(notice, peer, Tag.BROKEN), notice))

    def _refuse(self) -> None:
        if self.freed:
            raise FreedCommunicatorError(
                f"rank {self._rank}: this communicator was freed (Communicator.free()); make a new one"
            )
        raise BrokenCommunicatorError(
            f"rank {self._rank}: this communicator is unusable: {self.broken}", rank=self.broken_by
        )

    def _concurrent(self, collective: str) -> None:
        """Refuse a call made while another thread's runs; break the communicator on every rank."""
        owner = self.claimed_by  # 0 only in the instant between another thread's claim and its mark
        running = _thread_name(owner) if owner else "another thread"
        calling = _thread_name(threading.get_ident())
        message = (
            f"rank {self._rank}: {calling} called {collective} while {running}'s collective on the same "
            "communicator was running; calls on one communicator must be ordered by the program "
            '(see the README\'s "Threads"); this communicator is unusable now'
        )
        self.break_off(f"{calling} called {collective} while {running}'s call ran")
        raise ConcurrentCallError(message, running=running, calling=calling, rank=self._rank)

    def _agree(self, call: Call, guard: PackedSignature, sequence: int) -> None:
        """Agree with every other rank as :meth:`watch` does; raise on every rank if the signatures differ."""
        guard.stamp(sequence, self.tag)
        if self.shared is None:
            self._exchange(call, guard, sequence)
            return
        call.pending = guard
        call.barrier(self.shared)
