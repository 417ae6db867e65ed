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
"""

__all__ = ["LeanShared"]

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .lean import SPIN_S, LeanBook, Repeats
from .transport.base import SharedMemory
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from .communicator import Communicator
    from .execute_shared import SharedExecutor
    from .ops import ReduceOp

_monotonic = time.monotonic


class LeanShared(LeanBook):
    """Runs a repeated call's executor steps with one signed barrier and no :class:`Call` unless it waits.

    Args:
        group: the communicator.
        executor: its shared-memory executor.
        guard: the packed signature the ranks agreed on.
        check: the call's ``check``, as the user gave it.
        algorithm: the algorithm's name, for the flight recorder and traces.
        op: the reduction, of a reduce (named in a mismatch's notes where it is the user's).
    """

    __slots__ = (
        "_barriers",
        "_call",
        "_check",
        "_entry",
        "_pending",
        "_record_as",
        "_sequence",
        "_size",
        "algorithm",
        "executor",
        "guard",
        "op",
        "watchdog",
    )

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
