"""The lean path of the other repeated shared-memory collectives: barrier, broadcast, reduce and all-gather.

What :mod:`collectives.lean` does for a repeated allreduce, for a repeated call of
another collective on the shared-memory executor: it claims the communicator,
takes the next sequence number and, unless checking is off, posts the call's
signature (with that number and the watchdog's tag) with the executor's first
barrier and compares the others' after it, so a call that meets another call on
another rank raises :class:`~collectives.MismatchError` on every rank. Calls in a
row share one flight-recorder entry (:class:`~collectives.lean.Repeats`); a call
gets a :class:`~collectives.call.Call`, with its deadline and stall warning, only
where it waits past :data:`~collectives.lean.SPIN_S` or fails. A call that passes
no barrier of the executor (nothing to move) passes one for its signature.

Where the compiled engine runs, a small reduce-scatter's, all-gather's, broadcast's or
reduce's call (one barrier: the executor's path for inputs that fit the window) and a
barrier are one call into it, bookkeeping included, as a small allreduce's
(:meth:`LeanShared.run_compiled`).
"""

__all__ = ["SMALL_ALLGATHER", "SMALL_BROADCAST", "SMALL_REDUCE", "SMALL_REDUCE_SCATTER", "LeanShared"]

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .engine import DONE, FINISH, NOT_TAKEN, LeanCore
from .lean import SPIN_S, LeanBook, Repeats
from .tracing.recorder import TRACER as _TRACE
from .transport.base import SharedMemory
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from .communicator import Communicator
    from .execute_shared import SharedExecutor
    from .ops import ReduceOp

_monotonic = time.monotonic

SMALL_REDUCE_SCATTER, SMALL_ALLGATHER, SMALL_BROADCAST, SMALL_REDUCE = 1, 2, 3, 4
"""The engine's small call's modes (``SharedMemory.small_kernel``): a share reduced; every region copied;
the root's copied; every region reduced at the root."""


class LeanShared(LeanCore, LeanBook):
    """Runs a repeated call's executor steps with one signed barrier and no :class:`Call` unless it waits.

    Args:
        group: the communicator.
        executor: its shared-memory executor.
        guard: the packed signature the ranks agreed on.
        check: the call's ``check``, as the user gave it.
        algorithm: the algorithm's name, for the flight recorder and traces.
        op: the reduction, of a reduce (named in a mismatch's notes where it is the user's).
    """

    __slots__ = ("_kernel_asked", "_pending", "_record_as", "_size", "algorithm", "op")  # and LeanCore's

    def __init__(
        self,
        group: "Communicator",
        executor: "SharedExecutor",
        guard: PackedSignature,
        check: bool | None,
        algorithm: str,
        op: "ReduceOp | None" = None,
    ) -> None:
        self._book(group, executor, guard, check, algorithm, op, Repeats)
        self._size = group.size
        self.averages = False  # the repeat divides an average's result itself
        self._kernel: Any = None  # the engine's small call, where it takes these calls (compiled_call)
        self._kernel_asked = False
        self._tag: bytes | None = None  # the watchdog's tag the compiled calls' signature has
        self._tracer = _TRACE
        self._posted, self._turn, self._began = 0, 0, 0.0

    def compiled_call(self, make: Callable[..., Any], *arguments: Any) -> Any:
        """The engine's small call for these calls: ``make(*arguments)``'s, asked once (None: Python's)."""
        if not self._kernel_asked:
            self._kernel_asked = True
            self._kernel = make(*arguments)
        return self._kernel

    def run_compiled(self, work: Any, source: Any, steps: Callable[..., object], *arguments: Any) -> None:
        """``work`` from every rank's ``source`` in one call into the engine's small call (see
        :meth:`compiled_call`), bookkeeping and all; where it does not take the call, :meth:`run`."""
        status = self.start(work, source)
        if status == NOT_TAKEN:  # a broken or claimed communicator: the Python path says why
            self.run(steps, *arguments)
        elif status != DONE:
            self.went_on(status, work)

    def went_on(self, status: int, work: Any) -> None:
        """The rest of a call whose compiled start returned ``status``: taken, not done."""
        if status != FINISH:  # claimed and arrived: a rank is late, or the signatures differ
            try:
                self._compiled_waits(status, self._turn, work, self._posted)
            except BaseException as error:
                self._failed(error)
                raise
        self._close(self.guard.signature.collective, self._sequence, self._began, released=status == FINISH)

    def run(self, steps: Callable[..., object], *arguments: Any) -> None:
        """``steps(*arguments, barrier)`` as one call: the executor's steps, ``barrier`` its barrier."""
        collective = self.guard.signature.collective
        sequence, began = self._begin(collective)
        watchdog = self.watchdog
        check = self._check
        try:
            if (watchdog.check if check is None else check) and self._size > 1:
                self.guard.stamp(sequence, watchdog.tag)
                self._pending = True
            steps(*arguments, self.barrier)
            if self._pending:  # the steps passed no barrier: the signature's own
                self.barrier(self.executor.shared)
        except BaseException as error:
            self._failed(error)
            raise
        self._close(collective, sequence, began)

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        """The executor's barrier: the signature goes with the first; a long wait is a Call's."""
        passed = self._barriers
        self._barriers = passed + 1
        call = self._call
        if self._pending:
            self._pending = False
            guard = self.guard
            if call is None and not note:  # posted, passed and compared in one call of the memory's
                matched = shared.pass_signed(guard.packed, guard.digest, self._sequence, SPIN_S)
                if matched is None:  # a rank is late: wait on as a Call, which compares the signatures after
                    call = self._record()
                    call.pending = guard
                    call.arrived(shared, passed, ranks)
                elif not matched:
                    self.watchdog.compare_posted(shared, guard, self._sequence)  # raises where they differ
                return
            shared.post_signature(guard.packed, guard.digest, self._sequence)
            shared.arrive(note)
            call = call or self._record()
            call.pending = guard
            call.arrived(shared, passed, ranks)
            return
        shared.arrive(note)
        if call is None and not shared.wait(SPIN_S):
            return
        (call or self._record()).arrived(shared, passed, ranks)
