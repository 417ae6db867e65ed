"""The lean path of a repeated shared-memory allreduce: a persistent start's, or a plain call's repeat.

A call whose ranks agreed on its decisions once (a persistent call's init, or the
first plain call of a key: :mod:`collectives.repeats`) runs here on the
shared-memory executor with the safeties of any call, at less cost: it claims the
communicator against other threads, takes the next sequence number, and unless
checking is off posts its signature (with that number and the watchdog's tag) for
the executor's one barrier and compares the others' after it, so a call that
meets another call on another rank raises :class:`~collectives.MismatchError` on
every rank. Calls in a row share one flight-recorder entry (their first and last
numbers, and how many); a call gets a :class:`~collectives.call.Call` of its own,
with its deadline and stall warning, only where it waits past :data:`SPIN_S` or
fails, so a rank that never calls leaves the others a
:class:`~collectives.CollectiveTimeout`. With ``$COLLECTIVES_DEBUG`` or an armed
``$COLLECTIVES_FAULT`` the callers take the plain path instead. Where the compiled
engine runs (:mod:`collectives.engine`) and reduces the call's dtype and op (a built-in
op's, or a custom op's that names its compiled combine), a small call's copy-in,
barrier, signature check and reduction are one call into it.
"""

__all__ = ["SPIN_S", "LeanAllreduce", "LeanBook", "Repeats"]

import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from .call import Call, Starts
from .engine import DONE, FINISH, LATE, MISMATCH, NOT_TAKEN, LeanCore
from .errors import MismatchError
from .ops import itemsize
from .tracing.recorder import TRACER as _TRACE
from .transport.base import SharedMemory
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from .backends import ArrayBackend
    from .communicator import Communicator
    from .execute_shared import SharedExecutor
    from .ops import ReduceOp

_monotonic = time.monotonic
_get_ident = threading.get_ident

SPIN_S = 0.001
"""How long a lean call waits at a barrier before it makes its Call: its deadline, warnings and record.

Most barriers are passed well within it; past it the Call's deadline (from then) bounds the wait.
"""


class Repeats(Starts):
    """One flight-recorder entry for a plain call's lean repeats in a row, as :class:`Starts` for starts."""

    __slots__ = ()

    def line(self, rank: int) -> str:
        return super().line(rank).replace(" persistent starts=", " repeated calls=")


class LeanBook:
    """What a lean call keeps of ``Watchdog.watch``/``end`` itself, written out: a Call only where it waits.

    The claim, the sequence number, one flight-recorder entry for calls in a row
    (``_record_as``: :class:`Repeats`, or :class:`Starts` for persistent starts), a
    :class:`~collectives.call.Call` made only where the call waits past :data:`SPIN_S` or
    fails (``_record``), and the end. A base of :class:`LeanAllreduce` and of the other
    collectives' lean path (:mod:`collectives.lean_shared`), whose fields these are.
    """

    if not TYPE_CHECKING:  # no fields of its own (its subclasses' slots); the checker reads the names below
        __slots__ = ()
    watchdog: Any
    executor: "SharedExecutor"
    guard: PackedSignature
    algorithm: str
    op: "ReduceOp | None"
    _check: bool | None
    _sequence: int
    _barriers: int
    _call: Call | None
    _entry: Starts | None
    _pending: bool
    _record_as: type[Starts]
    _kernel: Any  # the engine's small call, where one runs these calls

    def _book(
        self,
        group: "Communicator",
        executor: "SharedExecutor",
        guard: PackedSignature,
        check: bool | None,
        algorithm: str,
        op: "ReduceOp | None",
        record: type[Starts],
    ) -> None:
        """Set the fields above for ``group``'s repeated calls of ``guard``'s signature, none made yet."""
        self.watchdog = group.watchdog
        self.executor = executor
        self.guard = guard
        self.algorithm = algorithm
        self.op = op
        self._check = check
        self._record_as = record
        self._pending = False
        self._sequence = 0
        self._barriers = 0
        self._call = None
        self._entry = None

    def _begin(self, collective: str) -> tuple[int, float]:
        """Claim the communicator, take the next sequence number and count the call in; it and its start."""
        watchdog = self.watchdog
        watchdog.claim(collective)
        began = _monotonic()
        sequence = watchdog.sequence
        watchdog.sequence = sequence + 1
        self._sequence = sequence
        self._barriers = 0
        self._call = None
        entry = self._entry
        recorder = watchdog.recorder
        if entry is not None and recorder and recorder[-1] is entry:  # no other call since: count it in
            entry.last = sequence
            entry.starts += 1
        else:
            self._new_entry(sequence)
        return sequence, began

    def _new_entry(self, sequence: int) -> None:
        """A flight-recorder entry of its own for the calls in a row from call ``sequence`` on."""
        entry = self._entry = self._record_as(self.guard.signature, sequence, self.algorithm)
        self.watchdog.recorder.append(entry)

    def _close(self, collective: str, sequence: int, began: float, released: bool = False) -> None:
        """A call's end: the claim given back (unless ``released``), the late check, its trace or Call."""
        watchdog = self.watchdog
        call = self._call
        if call is None:
            if not released:
                watchdog.release()
            if began - watchdog.last_began >= watchdog.late_after:  # as Watchdog.end asks
                watchdog.late(collective, sequence)
            watchdog.last_began = began
            if _TRACE.on:  # a record of its own only where traced (see collectives.tracing)
                _TRACE.record((self, sequence, began, _monotonic(), watchdog.tag))
        else:
            call.began = began  # it became a Call only as it waited: its time is the whole call's
            watchdog.end(call)

    def _record(self) -> Call:
        """The call's Call, made when it must wait (or failed): its deadline, warnings and own record."""
        watchdog = self.watchdog
        call = self._call = Call(watchdog, self.guard.signature, self._sequence)
        call.algorithm = self.algorithm
        entry = self._entry
        if entry is not None:  # the call's own record replaces its count in the lean calls' entry
            if entry.starts == 1 and watchdog.recorder and watchdog.recorder[-1] is entry:
                watchdog.recorder.pop()
            else:
                entry.starts -= 1
                entry.last -= 1
        self._entry = None
        watchdog.recorder.append(call)
        return call

    def _failed(self, error: BaseException) -> None:
        """End the claimed call with ``error`` (its Call made if it had none), as every call's end does."""
        self._pending = False
        failed = self._call or self._record()
        failed.pending = None  # the error is the call's, whatever its signature
        op = self.op
        if isinstance(error, MismatchError) and op is not None and op.custom:
            error.add_note(f"rank {self.watchdog.transport.rank}'s op {op.name!r} is {op.agreed_name!r}")
        self.watchdog.end(failed, error)

    def _compiled_waits(self, status: int, turn: int, work: Any, digest: int) -> None:
        """After the engine's call came back unfinished: wait on as a Call, or compare; then finish it."""
        shared = self.executor.shared
        if status == LATE:  # a rank is late: wait on as a Call, which compares the signatures after
            call = self._record()
            call.pending = self.guard if digest else None
            call.arrived(shared, 0, None)
        else:  # the signatures differ
            self.watchdog.compare_posted(shared, self.guard, self._sequence)  # raises where they differ
        self._kernel.reduce(turn, work)


class LeanAllreduce(LeanCore, LeanBook):
    """A repeated allreduce on the shared-memory executor, its signature carried by the executor's barrier.

    Args:
        group: the communicator.
        executor: its shared-memory executor.
        guard: the packed signature the ranks agreed on.
        check: the call's ``check``, as the user gave it.
        backend: the arrays' backend.
        op: the reduction.
        algorithm: the algorithm's name, for the flight recorder.
        record: the flight-recorder entry's type (:class:`Starts` for persistent starts).
    """

    op: "ReduceOp"  # always an op, where the other lean calls' may be none

    __slots__ = (  # and LeanCore's fields
        "_pending",
        "_record_as",
        "_reduce",
        "_run",
        "_segments",
        "_segments_asked",
        "_small",
        "_views",
        "algorithm",
        "backend",
        "op",
        "size",
    )

    def __init__(
        self,
        group: "Communicator",
        executor: "SharedExecutor",
        guard: PackedSignature,
        check: bool | None,
        backend: "ArrayBackend",
        op: "ReduceOp",
        algorithm: str,
        record: type[Starts] = Repeats,
    ) -> None:
        self._book(group, executor, guard, check, algorithm, op, record)
        self.backend = backend
        self.averages = op.averages
        self.size = group.size
        signature = guard.signature
        small = self._small = executor.small(signature.count * itemsize(signature.dtype), op)
        # a call whose inputs together fit the small window skips the executor's choice of path
        self._run = executor.allreduce_small if small else executor.allreduce
        self._views: tuple[tuple[Any, list[Any]], ...] | None = None  # the small calls': made by the first
        self._kernel: Any = None  # the compiled engine's call, where it takes this one: made by the first
        self._segments: Any = None  # the engine's segmented call, for calls past the small window: the same
        self._segments_asked = small or group.size == 1
        self._tag: bytes | None = None  # the watchdog's tag the compiled calls' signature has
        self._reduce = backend.reducer(op)
        self._tracer = _TRACE
        self._posted, self._turn, self._began = 0, 0, 0.0

    def run(self, work: Any, source: Any) -> None:
        """``work`` = the allreduce of every rank's ``source`` (may be ``work``), divided for ``avg``."""
        # the compiled engine's whole call, where it takes this one; an error raised inside the call, its
        # claim held, is the call's: the engine ends it (_failed) before it goes up
        status = self.start(work, source)
        if status != DONE:
            self.went_on(status, work, source)

    def went_on(self, status: int, work: Any, source: Any) -> None:
        """The rest of a call whose compiled start returned ``status`` (not done); all of it if not taken."""
        if status == NOT_TAKEN:
            self._run_here(work, source)
            return
        if status != FINISH:  # claimed and arrived: a rank is late, or the signatures differ
            try:
                self._compiled_waits(status, self._turn, work, self._posted)
            except BaseException as error:
                self._failed(error)
                raise
        self._end(work, self._sequence, self._began, released=status == FINISH)

    def _run_here(self, work: Any, source: Any) -> None:
        """:meth:`run` on the Python path (the compiled engine's call, where made, called from here)."""
        # Watchdog.watch/end's steps written out, not called: they make a Call per call, a third of
        # this path's time; a Call is made here only where the call waits or fails (_record)
        watchdog = self.watchdog
        sequence, began = self._begin("allreduce")
        check = self._check
        try:
            kernel = self._kernel
            # the compiled call here where the start was refused as another thread held the claim and
            # that thread let go since: the engine's bits, as the other ranks' starts give them
            if kernel is not None:
                if watchdog.check if check is None else check:
                    guard = self.guard
                    tag = watchdog.tag
                    if tag is not self._tag:  # a new tag is a new signature (the engine stamps the number)
                        guard.stamp(sequence, tag)
                        self._tag = tag
                    packed, digest = guard.packed, guard.digest
                else:
                    packed, digest = None, 0
                executor = self.executor
                turn = executor.turn
                executor.turn = turn ^ 1
                self._barriers = 1
                status = kernel.run(turn, work, source, sequence, packed, digest)
                if status:
                    self._compiled_waits(status, turn, work, digest)
            elif (segments := self._segments_for(work, source)) is not None:
                self._segmented(segments, work, source, watchdog.check if check is None else check)
            elif self._small and self.size > 1:
                if watchdog.check if check is None else check:
                    self.guard.stamp(sequence, watchdog.tag)
                    self._small_call(self.guard, work, source)
                else:
                    self._small_call(None, work, source)
            elif (watchdog.check if check is None else check) and self.size > 1:
                self.guard.stamp(sequence, watchdog.tag)
                self._pending = True
                self._run(self.backend, work, source, self.op, self.barrier)
            else:
                self._run(self.backend, work, source, self.op, self.barrier)
        except BaseException as error:
            self._failed(error)
            raise
        self._end(work, sequence, began, released=False)

    def _segments_for(self, work: Any, source: Any) -> Any:
        """The engine's segmented call for this call past the small window, or None (the executor's path).

        Made by the first such call where the engine takes the dtype and op; a call
        takes it where it goes through the window (not the zero-copy path).
        """
        if not self._segments_asked:
            self._segments_asked = True
            combine = self.op.compiled_combine
            if self.backend.name == "numpy" and combine is not None and not self.guard.outgoing:
                self._segments = self.executor.segmented_kernel(self.backend, source, combine, SPIN_S)
        kernel = self._segments
        return kernel if kernel is not None and self.executor.through_window(work, source) else None

    def _segmented(self, kernel: Any, work: Any, source: Any, check: bool) -> None:
        """A call past the small window in one call into the engine, the twin of the executor's path.

        The engine hands back a late barrier to wait on as a Call (its signature
        compared after, at the first), and differing signatures or notes to raise on.
        """
        executor, guard = self.executor, self.guard
        if check:
            guard.stamp(self._sequence, self.watchdog.tag)
            packed, digest = guard.packed, guard.digest
        else:
            packed, digest = None, 0
        shared = executor.shared
        status = kernel.run(executor.turn, work, source, self._sequence, packed, digest)
        while status != DONE:
            if status == LATE:
                call = self._call or self._record()
                if digest and kernel.passed == 1:  # the first barrier: the signatures compared after
                    call.pending = guard
                call.arrived(shared, kernel.passed - 1, None)
            elif status == MISMATCH:  # the digests differ: compare in full (a rank may have posted it whole)
                self.watchdog.compare_posted(shared, guard, self._sequence)  # raises where they differ
            else:
                executor.agreed_notes()  # raises: some rank runs the zero-copy path
                raise RuntimeError("the engine found differing notes that the executor did not")
            status = kernel.resume(work, source)
        executor.turn = kernel.turn
        self._barriers = kernel.passed

    def _end(self, work: Any, sequence: int, began: float, released: bool) -> None:
        """A call's end: the claim given back (unless ``released``), the late check, the average."""
        self._close("allreduce", sequence, began, released)
        if self.averages:
            self.backend.divide(work, self.size)

    def _small_call(self, guard: PackedSignature | None, work: Any, source: Any) -> None:
        """What the executor's ``allreduce_small`` does, its one barrier signed, in fewer Python calls.

        Inline rather than through the executor and :meth:`barrier` (they cost a
        third of an 8-byte call's time): copy in, post the signature (where
        ``guard`` is given) with the arrival, and reduce every rank's copy once
        all arrived and signed alike. The first call also makes the compiled
        engine's call, where it takes this one, for the calls after it.
        """
        executor = self.executor
        views = self._views
        if views is None:
            views = self._views = executor.small_views(self.backend, source)
            combine = self.op.compiled_combine
            if self.backend.name == "numpy" and combine is not None and not self.guard.outgoing:
                self._kernel = executor.small_call(self.backend, source, combine, SPIN_S)
        if guard is None:
            self._run(self.backend, work, source, self.op, self.barrier)
            return
        turn = executor.turn
        executor.turn = turn ^ 1
        mine, regions = views[turn]
        mine[...] = source
        shared = executor.shared
        self._barriers = 1
        matched = shared.pass_signed(guard.packed, guard.digest, self._sequence, SPIN_S)
        if matched is None:  # a rank is late: wait on as a Call, which compares the signatures after
            call = self._record()
            call.pending = guard
            call.arrived(shared, 0, None)
        elif not matched:
            self.watchdog.compare_posted(shared, guard, self._sequence)  # raises where they differ
        if len(regions) == 2:
            self._reduce(work, regions[0], regions[1])
        else:
            executor.reduce(self.backend, self.op, work, regions)

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        """The executor's barrier: the signature goes with the first; a long wait is a Call's."""
        passed = self._barriers
        self._barriers = passed + 1
        pending = self._pending
        if pending:
            guard = self.guard
            shared.post_signature(guard.packed, guard.digest, self._sequence)
        shared.arrive(note)
        call = self._call
        if call is None and not shared.wait(SPIN_S):
            if pending:
                self._pending = False
                guard = self.guard
                if not shared.signatures_match(guard.packed, guard.digest, self._sequence):
                    self.watchdog.compare_posted(shared, guard, self._sequence)  # raises where they differ
            return
        if call is None:
            call = self._record()
        if pending:
            self._pending = False
            call.pending = self.guard
        call.arrived(shared, passed, ranks)

