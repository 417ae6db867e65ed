"""The calls dispatch routes to the shared-memory executor: each run from its checked call, and its repeat.

:func:`~collectives.dispatch.run` hands a call here once the ranks agreed on it and
chose the ``shared_memory`` algorithm, with numpy arrays on one node's memory:
:func:`run_shared` runs it, and :func:`keep_shared` keeps the decisions a later
call of its key runs on (:mod:`collectives.repeats`), on the lean path where the
signature can travel with the executor's first barrier.
"""

__all__ = ["SharedJob", "keep_shared", "run_shared"]

from collections.abc import Callable
from typing import Any, Protocol

from .backends import ArrayBackend
from .call import Call
from .communicator import Communicator
from .execute_shared import SharedExecutor
from .lean import LeanAllreduce
from .lean_shared import LeanShared
from .ops import ReduceOp
from .repeats import (
    Repeat,
    RepeatedAllgather,
    RepeatedAllreduce,
    RepeatedBarrier,
    RepeatedBroadcast,
    RepeatedReduce,
    RepeatedReduceScatter,
)
from .watchdog import PackedSignature


class SharedJob(Protocol):
    """What a shared-memory run needs of a checked call (:class:`~collectives.dispatch.CheckedCall`)."""

    collective: str
    backend: ArrayBackend
    op: ReduceOp | None
    work: Any
    source: Any
    root: int
    shares: tuple[int, ...] | None
    shape: tuple[int, ...]
    result: Any
    repeat: Repeat | None


def run_shared(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    """Run ``job``'s call on the shared-memory executor under ``call``; the buffer with this rank's result."""
    return _ON_SHARED[job.collective](group, call, shared, job, check)


def keep_shared(
    group: Communicator,
    call: Call,
    job: SharedJob,
    result: Any,
    *,
    shared: SharedExecutor,
    guard: PackedSignature,
    check: bool | None,
    repeatable: bool,
) -> None:
    """Keep the decisions of a call the shared-memory executor ran, where a later call can run on them.

    ``repeatable``: whether an allreduce's call may be repeated (decided before its ranks agreed,
    its input not copied into its result first).
    """
    backend, op, repeat, shares = job.backend, job.op, job.repeat, job.shares
    assert repeat is not None  # only asked for calls that have one
    if backend.name != "numpy":
        return
    collective = job.collective
    if collective == "allreduce":
        assert op is not None  # an allreduce reduces
        if not repeatable:
            return
        lean_allreduce = None
        if group.watchdog.shared is not None:
            # its signature travels with the executor's barrier: later calls of the key run lean
            lean_allreduce = LeanAllreduce(group, shared, guard, check, backend, op, call.algorithm)
        repeat.keep(
            RepeatedAllreduce(
                backend=backend, op=op, guard=guard, shape=job.shape, shared=shared, lean=lean_allreduce
            )
        )
        return
    # the signature travels with the executor's first barrier: later calls of the key run lean
    lean = None
    if group.watchdog.shared is not None:
        lean = LeanShared(group, shared, guard, check, call.algorithm, op)
    if collective == "barrier":
        repeat.keep(RepeatedBarrier(guard=guard, shared=shared, lean=lean))
        return
    shape = job.shape
    if collective in ("broadcast", "reduce"):
        kind = RepeatedBroadcast if collective == "broadcast" else RepeatedReduce
        repeat.keep(
            kind(backend=backend, op=op, guard=guard, shape=shape, shared=shared, root=job.root, lean=lean)
        )
        return
    # a reduce-scatter's share in a buffer of its own is not one to repeat: a repeat writes into out
    own_buffer = collective == "reduce_scatter" and result is not job.result
    if shares is None or own_buffer:
        return
    of_shares = RepeatedAllgather if collective == "allgather" else RepeatedReduceScatter
    repeat.keep(
        of_shares(backend=backend, op=op, guard=guard, shape=shape, shared=shared, shares=shares, lean=lean)
    )

# --- the collectives the shared-memory executor runs, by name


def _allreduce(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    work, source, op = job.work, job.source, job.op
    assert op is not None  # an allreduce reduces
    shared.allreduce(job.backend, work, work if source is None else source, op, call.barrier)
    return work


def _reduce_scatter(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    backend, op, shares, mine = job.backend, job.op, job.shares, job.result
    assert op is not None and shares is not None  # see dispatch's _shared
    # straight into the result, unless it overlaps the input
    target = backend.empty(shares[group.rank], job.source) if mine is None else mine
    shared.reduce_scatter(backend, target, job.source, shares, op, call.barrier)
    return target


def _allgather(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    backend, work, shares = job.backend, job.work, job.shares
    assert shares is not None  # an allgather has its shares
    lo = sum(shares[: group.rank])
    shared.allgather(backend, work, work[lo : lo + shares[group.rank]], shares, call.barrier)
    return work


def _broadcast(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    shared.broadcast(job.backend, job.work, job.root, call.barrier)
    return job.work


def _reduce(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> Any:
    assert job.op is not None  # a reduce reduces
    # the workspace holds a copy of this rank's input: the root reduces into it in place
    shared.reduce_to(job.backend, job.work, job.work, job.op, job.root, call.barrier)
    return job.work


def _barrier(
    group: Communicator, call: Call, shared: SharedExecutor, job: SharedJob, check: bool | None
) -> None:
    """The barrier the ranks agreed on the call's signature through is the whole call; else one here."""
    watchdog = group.watchdog
    signed = watchdog.shared is shared.shared and (watchdog.check if check is None else check)
    if not signed:
        shared.barrier(call.barrier)


_ON_SHARED: dict[str, Callable[[Communicator, Call, SharedExecutor, Any, bool | None], Any]] = {
    "allreduce": _allreduce,
    "reduce_scatter": _reduce_scatter,
    "allgather": _allgather,
    "broadcast": _broadcast,
    "reduce": _reduce,
    "barrier": _barrier,
}
