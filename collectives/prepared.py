"""Repeated calls: the decisions a call made once it had checked its arguments, reused by later ones.

A key names everything the decisions depend on (the arrays' type, shape and
dtype, the op, the algorithm, where the result goes, the check), so a call that
finds its key skips validation, the selector, the schedule and plan caches and
the packing of its signature; the watchdog still numbers, checks, bounds and
records it like any other. An allreduce's decisions are made before its ranks
agree on the call where they can be (:func:`opening`), so that even its first
call can send its first messages with its signature.
"""

__all__ = [
    "KEPT",
    "Opening",
    "Prepared",
    "allgather_prepared",
    "allreduce_key",
    "allreduce_plan",
    "allreduce_prepared",
    "check_of",
    "fits",
    "fits_shares",
    "opening_of",
    "reduce_scatter_prepared",
    "remember",
    "shares_key",
]

from collections.abc import Callable
from dataclasses import InitVar, dataclass, field
from typing import TYPE_CHECKING, Any

from .algorithms import ALGORITHMS, rank_program
from .algorithms.base import required_feature
from .backends import ArrayBackend
from .errors import CollectivesError
from .execute import DEFAULT_SEGMENT_BYTES, PLANS_BUDGET, Plan, opening, pack_opening, program_plan, run
from .execute_shared import SharedExecutor
from .faults import PLAN as FAULTS
from .lean import LeanAllreduce
from .ops import ReduceOp
from .selector import AUTO
from .watchdog import FUSED_BYTES, Guard

if TYPE_CHECKING:
    from .communicator import Communicator

KEPT = 256
"""Distinct repeated calls remembered per communicator."""

_OPS = (str, ReduceOp)  # a tuple: ``isinstance(op, str | ReduceOp)`` builds the union every call, 0.1 us


@dataclass(slots=True, eq=False)
class Prepared:
    """What a call decided once it had checked its arguments, reused by every later call of its key.

    Attributes:
        backend: the arrays' backend.
        op: the reduction, of the collectives that reduce.
        guard: the call's packed signature.
        plan: this rank's plan; ``None`` where the shared-memory executor runs the call.
        shared: the shared-memory executor, where it runs the call.
        scratch: the plan's scratch buffer.
        shape: the result's shape.
        averages: whether the result is divided by the world size.
        sends: the opening sends, packed into ``outgoing`` before the signature goes.
        outgoing: per peer, the data that travels with the signature.
        arrived: the opening receives, by peer, once the signature has come.
        shares: of a reduce-scatter or all-gather: every rank's elements.
        lean: of an allreduce on shared memory whose signature travels with the
            executor's barrier: its lean path (:mod:`collectives.lean`).
        fits: ``fits(prepared, x, out)``, whether a later call's arrays pass the first one's checks.
        reuse: ``reuse(group, prepared, x, out, check)``, a later call run on these decisions.
    """

    backend: ArrayBackend
    op: ReduceOp | None
    guard: Guard
    plan: Plan | None
    scratch: Any
    shape: tuple[int, ...]
    sends: tuple[Any, ...]
    outgoing: dict[int, Any]
    arrived: dict[int, Any] | None
    shared: SharedExecutor | None = None
    shares: tuple[int, ...] = ()
    collective: InitVar[str] = "allreduce"
    averages: bool = field(init=False)
    lean: LeanAllreduce | None = field(init=False, default=None)
    fits: Callable[["Prepared", Any, Any], bool] = field(init=False)
    reuse: Callable[..., Any] = field(init=False)

    def __post_init__(self, collective: str) -> None:
        self.averages = self.op is not None and self.op.averages
        self.fits, self.reuse = _REUSED[collective]


def remember(group: "Communicator", key: tuple[Any, ...], prepared: Prepared) -> None:
    """Keep ``prepared`` for the later calls of ``key`` on ``group``.

    At most :data:`KEPT` calls, whose plans hold at most :data:`PLANS_BUDGET`
    together: a plan grows with the world size (a ring's has 2 (P - 1) steps).
    """
    kept = group.prepared
    held = sum(_plan_size(p) for p in kept.values())  # only a call's first run gets here
    if len(kept) >= KEPT or held + _plan_size(prepared) > PLANS_BUDGET:
        kept.clear()  # start afresh rather than evict one by one
    kept[key] = prepared


def _plan_size(prepared: Prepared) -> int:
    return 0 if prepared.plan is None else prepared.plan.size


# --- allreduce


def allreduce_key(x: Any, op: Any, out: Any, algorithm: str, check: bool | None) -> tuple[Any, ...] | None:
    """The key of an allreduce's decisions; ``None`` for arguments no decision is kept for.

    Its last item is the call's ``check`` (see :func:`check_of`).
    """
    if op.__class__ is not str and not isinstance(op, _OPS):
        return None
    result = "new" if out is None else "in place" if out is x else "out"
    try:
        return (type(x), x.shape, x.dtype, op, algorithm, result, check)
    except AttributeError:
        return None


def check_of(key: tuple[Any, ...]) -> bool | None:
    """The ``check`` of the call whose decisions :func:`allreduce_key` keyed ``key``."""
    check: bool | None = key[-1]
    return check


def fits(prepared: Prepared, x: Any, out: Any) -> bool:
    """Whether the arrays of a call whose key matched pass the checks its first call made.

    Contiguity, writability and overlap belong to the arrays, not to the key.
    """
    flags = x.flags
    if not flags.c_contiguous:
        return False
    if out is None:
        return True
    if out is x:
        return bool(flags.writeable)
    return _separate_out(prepared, x, out)


def _separate_out(prepared: Prepared, x: Any, out: Any) -> bool:
    """Whether ``out`` is writable, C-contiguous, of x's type, dtype and prepared shape, and apart from x."""
    return (
        type(out) is type(x)
        and out.shape == prepared.shape
        and out.dtype == x.dtype
        and out.flags.c_contiguous
        and out.flags.writeable
        and not prepared.backend.shares_memory(out, x)
    )


def allreduce_prepared(
    group: "Communicator", prepared: Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """allreduce by decisions an earlier call of the same key made and checked."""
    backend, op = prepared.backend, prepared.op
    assert op is not None  # the records of calls that reduce have their op
    if out is x:
        work, source = (x if x.ndim == 1 else x.reshape(-1)), None
    else:
        work = backend.empty(x.size, x) if out is None else out.reshape(-1)
        source = x.reshape(-1)
    lean = prepared.lean
    if lean is not None and not FAULTS.armed and not lean.watchdog.debug:
        lean.run(work, work if source is None else source)
        return work.reshape(prepared.shape) if out is None else out
    watchdog = group.watchdog
    if prepared.arrived is not None:
        # the opening's buffers are the communicator's: claim it before writing them, so that
        # another thread's call cannot overwrite this one's first messages
        watchdog.claim("allreduce")
        try:
            pack_opening(prepared.sends, backend, work, source, prepared.outgoing)
        except BaseException:
            watchdog.release()
            raise
        call = watchdog.watch(prepared.guard, check, first_barrier=prepared.plan is None, claimed=True)
    else:
        # the call ends by hand, not by a with block: measured, that costs 0.1 us of this path's 5
        call = watchdog.watch(prepared.guard, check, first_barrier=prepared.plan is None)
    try:
        if prepared.plan is None:
            shared = prepared.shared
            assert shared is not None  # a prepared call has a plan or the shared executor
            shared.allreduce(backend, work, work if source is None else source, op, call.barrier)
        else:
            run(
                prepared.plan,
                call.transport,
                backend,
                work,
                op,
                prepared.scratch,
                source,
                prepared.arrived,
            )
    except BaseException as error:
        try:
            watchdog.end(call, error)
        finally:
            if watchdog.broken is not None:  # MPI may still write into them: keep them
                watchdog.kept.append((x, out, work, source, prepared.scratch))
        raise
    watchdog.end(call)
    if prepared.averages:
        backend.divide(work, group.size)
    return work.reshape(prepared.shape) if out is None else out


def allreduce_plan(
    group: "Communicator", algorithm: str, count: int, item_bytes: int, separate: bool
) -> Plan:
    """This rank's plan of an allreduce by ``algorithm`` (a name, not ``"auto"``), from its program alone."""
    program = rank_program("allreduce", algorithm, group.size, count, rank=group.rank)
    return program_plan(program, max(DEFAULT_SEGMENT_BYTES // item_bytes, 1), separate)


@dataclass(slots=True, eq=False)
class Opening:
    """An allreduce's decisions known before its ranks agree on the call, and its first messages.

    Attributes:
        algorithm: the algorithm that runs (a name, not ``"auto"``).
        plan: this rank's plan; ``None`` where the shared-memory executor runs the call.
        guard: the call's packed signature, with room for the data that travels with it.
        sends: the first sends that travel with the signature.
        outgoing: per peer, their data, packed already.
        arrived: per peer, where the first receives that travel with the signature land.
    """

    algorithm: str
    plan: Plan | None
    guard: Guard
    sends: tuple[Any, ...]
    outgoing: dict[int, Any]
    arrived: dict[int, Any] | None


def opening_of(
    group: "Communicator",
    check: bool | None,
    algorithm: str,
    backend: ArrayBackend,
    op: ReduceOp,
    work: Any,
    source: Any,
    item_bytes: int,
) -> Opening | None:
    """An allreduce's decisions and first messages, where they are known before the ranks agree on the call.

    Small calls' first messages travel with the signature (see :func:`_fuses`),
    packed here from ``source`` (``work`` where ``None``).
    """
    if not op.commutative:
        return None  # its algorithm is chosen among those that keep the ranks' order, once agreed
    count = work.size
    early = _plan_early(group, algorithm, count, item_bytes, source is not None, backend)
    if early is None:
        return None
    chosen, early_plan = early
    fused = early_plan is not None and _fuses(group, check, count * item_bytes, backend)
    sends, recvs = opening(early_plan) if early_plan is not None and fused else ((), ())
    payloads = {m.peer: (m.hi - m.lo) * item_bytes for m in sends}
    watchdog = group.watchdog
    dtype = backend.dtype_name(work)
    guard = watchdog.guard(
        "allreduce", algorithm, count, dtype, op.agreed_name, backend=backend.name, payloads=payloads
    )
    outgoing = {peer: backend.from_bytes(view, work) for peer, view in guard.outgoing.items()}
    arrived = None
    if sends or recvs:
        pack_opening(sends, backend, work, source, outgoing)
        arrived = {
            m.peer: backend.from_bytes(watchdog.arrived(m.peer, (m.hi - m.lo) * item_bytes), work)
            for m in recvs
        }
    return Opening(chosen, early_plan, guard, sends, outgoing, arrived)


def _plan_early(
    group: "Communicator", algorithm: str, count: int, item_bytes: int, separate: bool, backend: ArrayBackend
) -> tuple[str, Plan | None] | None:
    """The algorithm and plan, when they are known before the ranks agree on the call.

    They are for a named algorithm, or for ``"auto"`` once the ranks have agreed on
    the selector (the first ``"auto"`` call sends messages to agree, which must wait
    until the call's signature is checked), and only for an algorithm that runs a
    schedule over the transport (the plan), or that runs on the shared-memory
    executor once the ranks have set it up (no plan). Whether they are known
    depends on the signature alone, so the ranks of a matching call all know them
    or all do not.
    """
    features = group.known_features  # asking for them may be collective, which must wait for the check too
    if algorithm == AUTO:
        selector = group.selector
        if selector is None or features is None:
            return None
        tuner = group.tuner
        if tuner is None:
            algorithm = selector.choose("allreduce", group.size, count, item_bytes, features)
        else:  # still tuning: chosen once the ranks agree on the call
            decided = tuner.decided("allreduce", group.size, count, item_bytes, features)
            if decided is None:
                return None
            algorithm = decided
    needs = required_feature(ALGORITHMS[algorithm])
    if needs is not None:
        # features are set up collectively by the first call that needs them, never before agreeing
        known = features is not None and needs in features and group.shared is not None
        return (algorithm, None) if known and needs == "shared_memory" and backend.name == "numpy" else None
    try:
        return algorithm, allreduce_plan(group, algorithm, count, item_bytes, separate)
    except (CollectivesError, ValueError):
        return None  # raised again once the call has been checked


def _fuses(group: "Communicator", check: bool | None, nbytes: int, backend: ArrayBackend) -> bool:
    """Whether a call's first messages travel with its signature, saving a round trip.

    Only when there is a signature to travel with, and the data is small: a
    receiver keeps room for that much from every peer. The same on every rank of a
    matching call, as its ranks agree on the check and on the count and dtype.
    """
    watchdog = group.watchdog
    checking = watchdog.check if check is None else check
    by_messages = watchdog.shared is None  # else the signature goes through shared memory, without data
    return checking and by_messages and group.size > 1 and nbytes <= FUSED_BYTES and backend.name == "numpy"


# --- reduce_scatter and allgather on shared memory


def shares_key(
    collective: str, x: Any, op: Any, counts: Any, out: Any, algorithm: str, check: bool | None
) -> tuple[Any, ...] | None:
    """The key of a reduce-scatter's or all-gather's decisions; ``None`` for arguments none is kept for."""
    if op is not None and op.__class__ is not str and not isinstance(op, _OPS):
        return None
    try:
        shares = None if counts is None else tuple(counts)
        return (collective, type(x), x.shape, x.dtype, op, shares, algorithm, out is None, check)
    except (AttributeError, TypeError):
        return None  # not an array, or counts not a sequence: the full path names the problem


def fits_shares(prepared: Prepared, x: Any, out: Any) -> bool:
    """Whether a reduce-scatter or all-gather whose key matched can run on its first call's decisions.

    Only what would make the call an error sends it down the full path (which
    names it): an ``out`` of another type, shape or dtype, or read-only. Strides
    and overlap are this rank's alone, so they are met here with a copy instead:
    ranks whose record matched all run the prepared path, whatever their arrays.
    """
    return out is None or (
        type(out) is type(x)
        and out.shape == prepared.shape
        and out.dtype == x.dtype
        and bool(out.flags.writeable)
    )


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


def reduce_scatter_prepared(
    group: "Communicator", prepared: Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """reduce_scatter by decisions an earlier call of the same key made and checked."""
    backend, shared, op = prepared.backend, prepared.shared, prepared.op
    assert shared is not None and op is not None  # only reductions run on shared memory are prepared
    flat = _apart(backend, x, None)  # the executor itself minds an out that overlaps x
    target = _target(backend, out, prepared.shares[group.rank], x)
    with group.watchdog.watch(prepared.guard, check, first_barrier=True) as call:
        shared.reduce_scatter(backend, target, flat, prepared.shares, op, call.barrier)
    if prepared.averages:
        backend.divide(target, group.size)
    if out is None:
        return target.reshape(prepared.shape)
    if not backend.shares_memory(target, out):
        backend.copy(out, target)
    return out


def allgather_prepared(
    group: "Communicator", prepared: Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """allgather by decisions an earlier call of the same key made and checked."""
    backend, shared, shares = prepared.backend, prepared.shared, prepared.shares
    assert shared is not None  # only calls run on the shared-memory executor are prepared
    work = _target(backend, out, sum(shares), x)
    mine = backend.flat_view(x)
    # x may be this rank's own part of work (in place); anywhere else in work it is copied first
    if mine is None or (
        backend.shares_memory(mine, work) and not _own_part(backend, mine, work, shares, group.rank)
    ):
        mine = _apart(backend, x, work)
    # the executor copies this rank's part into work as it copies the others'
    with group.watchdog.watch(prepared.guard, check, first_barrier=True) as call:
        shared.allgather(backend, work, mine, shares, call.barrier)
    if out is None:
        return work.reshape(prepared.shape)
    if not backend.shares_memory(work, out):
        backend.copy(out, work)
    return out


_REUSED: dict[str, tuple[Callable[[Prepared, Any, Any], bool], Callable[..., Any]]] = {
    "allreduce": (fits, allreduce_prepared),
    "reduce_scatter": (fits_shares, reduce_scatter_prepared),
    "allgather": (fits_shares, allgather_prepared),
}
