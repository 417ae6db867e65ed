"""Repeated calls: the one room that keeps a call's decisions and hands a later call of its key a ready call.

The call path consults it once per call (:func:`find_repeat`). A key names
everything the decisions depend on (the arrays' type, shape and dtype, the op,
the algorithm, where the result goes, the check); a call whose key an earlier
call kept its decisions under, and whose arrays pass that call's checks
(:meth:`Repeat.fits`), runs on them (:meth:`Repeat.run`): it skips validation,
the selector, the schedule and plan caches and the packing of its signature; the
watchdog still numbers, checks, bounds and records it like any other, and on one
node's shared memory an allreduce runs on the lean path (:mod:`collectives.lean`).
Any other call of a kept collective gets a bare :class:`Repeat` of its key: the
path keeps there the decisions it made (:meth:`Repeat.keep`).
"""

__all__ = [
    "KEPT",
    "Repeat",
    "RepeatedAllgather",
    "RepeatedAllreduce",
    "RepeatedBarrier",
    "RepeatedBroadcast",
    "RepeatedReduce",
    "RepeatedReduceScatter",
    "find_repeat",
]

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from .backends import ArrayBackend, backend_for
from .execute import PLANS_BUDGET, ProgramPlan, pack_opening, run
from .execute_shared import SharedExecutor
from .faults import PLAN as FAULTS
from .lean import SPIN_S, LeanAllreduce
from .lean_shared import SMALL_ALLGATHER, SMALL_BROADCAST, SMALL_REDUCE, SMALL_REDUCE_SCATTER, LeanShared
from .ops import ReduceOp
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from .communicator import Communicator

KEPT = 256
"""Distinct repeated calls remembered per communicator."""

_OPS = (str, ReduceOp)  # a tuple: ``isinstance(op, str | ReduceOp)`` builds the union every call, 0.1 us


def find_repeat(
    group: "Communicator",
    collective: str,
    x: Any,
    out: Any,
    op: Any,
    counts: Any,
    algorithm: str,
    check: bool | None,
    root: Any = -1,
) -> "Repeat | None":
    """The call's ready repeat, or a bare one to keep its decisions in; ``None`` where none is kept.

    The arguments are the call's as the user gave them.
    """
    if op is not None and op.__class__ is not str and not isinstance(op, _OPS):
        return None
    try:
        if collective == "allreduce":
            key: tuple[Any, ...] = allreduce_key(x, out, op, algorithm, check)
        elif collective == "reduce_scatter" or collective == "allgather":
            shares = None if counts is None else tuple(counts)
            key = (collective, x.__class__, x.shape, x.dtype, op, shares, algorithm, out is None, check)
        elif collective == "broadcast" or collective == "reduce":
            if root.__class__ is not int:  # a bool or a numpy integer: the full path checks it
                return None
            result = "new" if out is None else "in place" if out is x else "out"
            key = (collective, x.__class__, x.shape, x.dtype, op, root, algorithm, result, check)
        elif collective == "barrier":
            key = ("barrier", algorithm, check)
        else:
            return None
    except (AttributeError, TypeError):
        return None  # not an array, or counts not a sequence: the full path names the problem
    kept = group.repeats
    ready: Repeat | None = kept.get(key)
    return Repeat(kept, key) if ready is None else ready


def allreduce_key(x: Any, out: Any, op: Any, algorithm: str, check: bool | None) -> tuple[Any, ...]:
    """The key of an allreduce's repeat (the compiled engine's ``repeat_in_place`` builds the same)."""
    result = "new" if out is None else "in place" if out is x else "out"
    return (x.__class__, x.shape, x.dtype, op, algorithm, result, check)


def keep_alias(group: "Communicator", key: tuple[Any, ...], alias: tuple[Any, ...]) -> None:
    """Keep the repeat kept under ``key`` under ``alias`` too: a call that reaches the same decisions by
    other arguments (a reproducible sum's, whose op and algorithm it chooses) finds them at once."""
    kept = group.repeats
    ready = kept.get(key)
    if ready is not None and kept.get(alias) is not ready:
        kept[alias] = ready


class Repeat:
    """A key's place in a communicator's repeated calls; kept decisions are its subclasses.

    A bare one keeps nothing yet: it fits no call, and the call that got it keeps
    its decisions in it once they are made.

    Attributes:
        key: what the decisions depend on (see :func:`find_repeat`).
    """

    __slots__ = ("_kept", "key")

    def __init__(self, kept: dict[tuple[Any, ...], "Repeat"], key: tuple[Any, ...]) -> None:
        self._kept = kept
        self.key = key

    def fits(self, x: Any, out: Any) -> bool:
        """Whether a call of this key with arrays ``x`` and ``out`` passes the checks its first call made."""
        return False

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        """Run a call that :meth:`fits` on the kept decisions; its result."""
        raise NotImplementedError("a bare repeat keeps no decisions")

    def plan_size(self) -> int:
        """The size of the plan it holds (see :data:`~collectives.execute.PLANS_BUDGET`)."""
        return 0

    def keep(self, ready: "Repeat") -> None:
        """Keep ``ready``'s decisions for the later calls of this key.

        At most :data:`KEPT` calls, whose plans hold at most :data:`PLANS_BUDGET`
        together: a plan grows with the world size (a ring's has 2 (P - 1) steps).
        """
        kept = self._kept
        held = sum(r.plan_size() for r in kept.values())  # only a call's first run gets here
        if len(kept) >= KEPT or held + ready.plan_size() > PLANS_BUDGET:
            kept.clear()  # start afresh rather than evict one by one
        ready._kept, ready.key = kept, self.key
        kept[self.key] = ready


class RepeatedAllreduce(Repeat):
    """An allreduce's decisions: its plan over messages, or the shared-memory executor (lean where it can).

    Attributes:
        backend: the arrays' backend.
        op: the reduction.
        averages: whether the result is divided by the world size.
        guard: the call's packed signature.
        shape: the result's shape.
        plan: this rank's plan; ``None`` where the shared-memory executor runs the call.
        scratch: the plan's scratch buffer.
        shared: the shared-memory executor, where it runs the call.
        sends: the first sends, packed into ``outgoing`` before the signature goes.
        outgoing: per peer, the data that travels with the signature.
        arrived: the first receives, by peer, once the signature has come.
        lean: where the signature travels with the shared-memory executor's
            barrier: the lean path (:mod:`collectives.lean`).
    """

    __slots__ = (
        "arrived",
        "averages",
        "backend",
        "guard",
        "lean",
        "op",
        "outgoing",
        "plan",
        "scratch",
        "sends",
        "shape",
        "shared",
    )

    def __init__(
        self,
        *,
        backend: ArrayBackend,
        op: ReduceOp,
        guard: PackedSignature,
        shape: tuple[int, ...],
        plan: ProgramPlan | None = None,
        scratch: Any = None,
        shared: SharedExecutor | None = None,
        sends: tuple[Any, ...] = (),
        outgoing: dict[int, Any] | None = None,
        arrived: dict[int, Any] | None = None,
        lean: LeanAllreduce | None = None,
    ) -> None:
        self.backend, self.op, self.averages, self.guard, self.shape = backend, op, op.averages, guard, shape
        self.plan, self.scratch, self.shared, self.lean = plan, scratch, shared, lean
        self.sends, self.outgoing, self.arrived = sends, {} if outgoing is None else outgoing, arrived

    def plan_size(self) -> int:
        return 0 if self.plan is None else self.plan.size

    def fits(self, x: Any, out: Any) -> bool:
        """Contiguity, writability and overlap belong to the arrays, not to the key."""
        flags = x.flags
        if not flags.c_contiguous:
            return False
        if out is None:
            return True
        if out is x:
            return bool(flags.writeable)
        return (
            type(out) is type(x)
            and out.shape == self.shape
            and out.dtype == x.dtype
            and out.flags.c_contiguous
            and out.flags.writeable
            and not self.backend.shares_memory(out, x)
        )

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        backend, op = self.backend, self.op
        if out is x:
            work, source = (x if x.ndim == 1 else x.reshape(-1)), None
        else:
            work = backend.empty(x.size, x) if out is None else out.reshape(-1)
            source = x.reshape(-1)
        lean = self.lean
        if lean is not None and not FAULTS.armed and not lean.watchdog.debug:
            lean.run(work, work if source is None else source)
            return work.reshape(self.shape) if out is None else out
        watchdog = group.watchdog
        keeps = (x, out, work, source, self.scratch)  # MPI may still write into them if the call breaks
        if self.arrived is not None:
            # the first messages' buffers are the communicator's: claim it before writing them, so that
            # another thread's call cannot overwrite this one's first messages
            watchdog.claim("allreduce")
            try:
                pack_opening(self.sends, backend, work, source, self.outgoing)
            except BaseException:
                watchdog.release()
                raise
            call = watchdog.watch(
                self.guard, check, first_barrier=self.plan is None, claimed=True, keeps=keeps
            )
        else:
            # the call ends by hand, not by a with block: measured, that costs 0.1 us of this path's 5
            call = watchdog.watch(self.guard, check, first_barrier=self.plan is None, keeps=keeps)
        try:
            if self.plan is None:
                shared = self.shared
                assert shared is not None  # a kept call has a plan or the shared executor
                shared.allreduce(backend, work, work if source is None else source, op, call.barrier)
            else:
                run(self.plan, call.transport, backend, work, op, self.scratch, source, self.arrived)
        except BaseException as error:
            watchdog.end(call, error)
            raise
        watchdog.end(call)
        if self.averages:
            backend.divide(work, group.size)
        return work.reshape(self.shape) if out is None else out


# --- reduce_scatter and allgather on shared memory


def _out_fits(x: Any, out: Any, shape: tuple[int, ...]) -> bool:
    """Whether a kept call of ``x`` may write ``out`` (or make one): its type, ``shape``, dtype, writable."""
    return out is None or (
        type(out) is type(x) and out.shape == shape and out.dtype == x.dtype and bool(out.flags.writeable)
    )


class _RepeatedOnShared(Repeat):
    """A collective's decisions on the shared-memory executor (lean where it can), but a barrier's."""

    __slots__ = ("backend", "guard", "lean", "op", "shape", "shared")

    def __init__(
        self,
        *,
        backend: ArrayBackend,
        op: ReduceOp | None,
        guard: PackedSignature,
        shape: tuple[int, ...],
        shared: SharedExecutor,
        lean: LeanShared | None = None,
    ) -> None:
        self.backend, self.op, self.guard, self.shape, self.shared, self.lean = (
            backend, op, guard, shape, shared, lean
        )  # fmt: skip

    def fits(self, x: Any, out: Any) -> bool:
        """Only what would make the call an error sends it down the full path (which names it).

        That is an ``out`` of another type, shape or dtype, or read-only. Strides
        and overlap are this rank's alone, so they are met here with a copy instead:
        ranks whose key matched all run the kept decisions, whatever their arrays.
        """
        return _out_fits(x, out, self.shape)


class _RepeatedShares(_RepeatedOnShared):
    """A reduce-scatter's or all-gather's decisions: each rank's share of the whole."""

    __slots__ = ("shares",)

    def __init__(self, *, shares: tuple[int, ...], **kept: Any) -> None:
        super().__init__(**kept)
        self.shares = shares


class RepeatedReduceScatter(_RepeatedShares):
    """A reduce-scatter's decisions on the shared-memory executor."""

    __slots__ = ()

    def _compiled(self, group: "Communicator", flat: Any) -> Any:
        """The engine's small call for these calls (their inputs fit the window: one barrier), or None."""
        op, shared = self.op, self.shared
        assert op is not None  # only reductions run on shared memory are kept
        if self.backend.name != "numpy" or op.compiled_combine is None or group.size == 1:
            return None
        if flat.nbytes == 0 or not shared.small(flat.nbytes, op, scatter=True):
            return None
        lo = sum(self.shares[: group.rank])
        share = (lo, lo + self.shares[group.rank])
        return shared.small_call(self.backend, flat, op.compiled_combine, SPIN_S, SMALL_REDUCE_SCATTER, share)

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        backend, shared, op = self.backend, self.shared, self.op
        assert op is not None  # only reductions run on shared memory are kept
        flat = _apart(backend, x, None)  # the executor itself minds an out that overlaps x
        target = _target(backend, out, self.shares[group.rank], x)
        _run_steps(
            self, group, check, shared.reduce_scatter, backend, target, flat, self.shares, op,
            small=(target, flat, self._compiled, group, flat),
        )  # fmt: skip
        if op.averages:
            backend.divide(target, group.size)
        if out is None:
            return target.reshape(self.shape)
        if not backend.shares_memory(target, out):
            backend.copy(out, target)
        return out


class RepeatedAllgather(_RepeatedShares):
    """An all-gather's decisions on the shared-memory executor."""

    __slots__ = ()

    def _compiled(self, group: "Communicator", mine: Any) -> Any:
        """The engine's small call for these calls (equal shares in one segment: one barrier), or None.

        It copies bytes, so it takes every dtype: its regions are the executor's as bytes.
        """
        shares, shared = self.shares, self.shared
        if self.backend.name != "numpy" or group.size == 1 or shares.count(shares[0]) != len(shares):
            return None
        if not 0 < mine.nbytes <= shared.segment_fits:
            return None
        return shared.small_call(self.backend, mine.view("uint8"), "bor", SPIN_S, SMALL_ALLGATHER)

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        backend, shared, shares = self.backend, self.shared, self.shares
        work = _target(backend, out, sum(shares), x)
        mine = backend.flat_view(x)
        # x may be this rank's own part of work (in place); anywhere else in work it is copied first
        if mine is None or (
            backend.shares_memory(mine, work) and not _own_part(backend, mine, work, shares, group.rank)
        ):
            mine = _apart(backend, x, work)
        # the executor copies this rank's part into work as it copies the others'
        _run_steps(
            self, group, check, shared.allgather, backend, work, mine, shares,
            small=(work, mine, self._compiled, group, mine),
        )  # fmt: skip
        if out is None:
            return work.reshape(self.shape)
        if not backend.shares_memory(work, out):
            backend.copy(out, work)
        return out


# --- broadcast, reduce and barrier on shared memory


class RepeatedBarrier(Repeat):
    """A barrier's decisions on the shared-memory executor: one barrier, carrying the signature."""

    __slots__ = ("guard", "lean", "shared")

    def __init__(
        self, *, guard: PackedSignature, shared: SharedExecutor, lean: LeanShared | None = None
    ) -> None:
        self.guard, self.shared, self.lean = guard, shared, lean

    def fits(self, x: Any, out: Any) -> bool:
        return True

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> None:
        _run_steps(self, group, check, self.shared.barrier, small=(NOTHING, NOTHING, self._compiled, group))

    def _compiled(self, group: "Communicator") -> Any:
        """The engine's small call of no bytes (an all-gather of nothing): one signed barrier; or None."""
        if group.size == 1:
            return None
        nothing = _NOTHING_ARRAY
        return self.shared.small_call(backend_for(nothing), nothing, "bor", SPIN_S, SMALL_ALLGATHER)


class _RepeatedRooted(_RepeatedOnShared):
    """A broadcast's or reduce's decisions: its root."""

    __slots__ = ("root",)

    def __init__(self, *, root: int, **kept: Any) -> None:
        super().__init__(**kept)
        self.root = root


class RepeatedBroadcast(_RepeatedRooted):
    """A broadcast's decisions on the shared-memory executor."""

    __slots__ = ()

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        backend = self.backend
        in_place = None if out is not x else backend.flat_view(x)
        work = _target(backend, out, x.size, x) if in_place is None else in_place
        if group.rank == self.root and in_place is None:
            backend.copy(work, x)  # the root's data, unless it is there already
        _run_steps(
            self, group, check, self.shared.broadcast, backend, work, self.root,
            small=(work, work, self._compiled, group, work),
        )  # fmt: skip
        return _delivered(backend, work, out, self.shape)

    def _compiled(self, group: "Communicator", work: Any) -> Any:
        """The engine's small call for these calls (one segment: one barrier), of bytes; or None."""
        shared = self.shared
        if self.backend.name != "numpy" or group.size == 1 or not 0 < work.nbytes <= shared.rooted_fits:
            return None
        as_bytes = work.view("uint8")
        return shared.small_call(self.backend, as_bytes, "bor", SPIN_S, SMALL_BROADCAST, None, self.root)


class RepeatedReduce(_RepeatedRooted):
    """A reduce's decisions on the shared-memory executor; the result at the root, ``None`` elsewhere."""

    __slots__ = ()

    def _compiled(self, group: "Communicator", mine: Any) -> Any:
        """The engine's small call for these calls (one segment: one barrier), or None."""
        op, shared = self.op, self.shared
        assert op is not None  # a reduce reduces
        combine = op.compiled_combine
        if self.backend.name != "numpy" or combine is None or group.size == 1:
            return None
        if not 0 < mine.nbytes <= shared.rooted_fits:
            return None
        return shared.small_call(self.backend, mine, combine, SPIN_S, SMALL_REDUCE, None, self.root)

    def run(self, group: "Communicator", x: Any, out: Any, check: bool | None) -> Any:
        backend, op, root = self.backend, self.op, self.root
        assert op is not None  # a reduce reduces
        if group.rank != root:  # the executor only reads x here, and out is never written
            mine = _apart(backend, x, None)
            _run_steps(
                self, group, check, self.shared.reduce_to, backend, mine, mine, op, root,
                small=(mine, mine, self._compiled, group, mine),
            )  # fmt: skip
            return None
        # in place the executor reduces over x itself; any other overlap takes a copy of x
        in_place = None if out is not x else backend.flat_view(x)
        target = _target(backend, out, x.size, x) if in_place is None else in_place
        mine = in_place if in_place is not None else _apart(backend, x, target)
        _run_steps(
            self, group, check, self.shared.reduce_to, backend, target, mine, op, root,
            small=(target, mine, self._compiled, group, mine),
        )  # fmt: skip
        if op.averages:
            backend.divide(target, group.size)
        return _delivered(backend, target, out, self.shape)


def _run_steps(
    kept: "RepeatedBarrier | _RepeatedOnShared",
    group: "Communicator",
    check: bool | None,
    steps: Callable[..., object],
    *arguments: Any,
    small: tuple[Any, ...] = (),
) -> None:
    """``steps(*arguments, barrier)`` as a call of ``kept``'s key: lean, or under the watchdog.

    Its first barrier carries the signature. With ``$COLLECTIVES_DEBUG`` or an armed
    ``$COLLECTIVES_FAULT`` it runs under the watchdog, whose Call those need. ``small``:
    ``(work, source, make, *its arguments)``, where the lean path holds the compiled engine's
    small call for these calls (``make``'s, asked at the first), that call from ``source`` into
    ``work`` instead of ``steps`` (:meth:`LeanShared.run_compiled`).
    """
    lean = kept.lean
    if lean is not None and not FAULTS.armed and not lean.watchdog.debug:
        if small and lean.compiled_call(*small[2:]) is not None:
            lean.run_compiled(small[0], small[1], steps, *arguments)
        else:
            lean.run(steps, *arguments)
        return
    with group.watchdog.watch(kept.guard, check, first_barrier=True) as call:
        steps(*arguments, call.barrier)


NOTHING = bytearray()
"""A writable buffer of no bytes: a barrier's input and output in the engine's small call."""
_NOTHING_ARRAY = np.frombuffer(NOTHING, np.uint8)


def _delivered(backend: ArrayBackend, work: Any, out: Any, shape: tuple[int, ...]) -> Any:
    """The result in ``work`` as ``out`` (copied unless ``work`` is ``out``'s own memory), or reshaped."""
    if out is None:
        return work.reshape(shape)
    if not backend.shares_memory(work, out):
        backend.copy(out, work)
    return out


def _apart(backend: ArrayBackend, x: Any, out: Any) -> Any:
    """``x`` flat and contiguous, and apart from ``out``: itself where it is, else a copy."""
    flat = backend.flat_view(x)
    if flat is None or (out is not None and backend.shares_memory(flat, out)):
        flat = backend.empty(x.size, x)
        backend.copy(flat, x)
    return flat


def _target(backend: ArrayBackend, out: Any, count: int, like: Any) -> Any:
    """Where the executor writes: ``out`` flat where it is contiguous, else a new buffer to copy into it."""
    flat = None if out is None else backend.flat_view(out)
    return backend.empty(count, like) if flat is None else flat


def _own_part(backend: ArrayBackend, mine: Any, work: Any, shares: Any, rank: int) -> bool:
    """Whether ``mine``, which overlaps ``work``, lies within ``rank``'s part of it (and so is that part)."""
    lo = sum(shares[:rank])
    return not (backend.shares_memory(mine, work[:lo]) or backend.shares_memory(mine, work[lo + mine.size :]))
