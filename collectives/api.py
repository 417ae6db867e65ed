"""The user's API: the collectives, the Communicator they run on, and explain.

Every collective takes, besides its own arguments:

``algorithm``
    the algorithm's name (``"ring"``, ``"tree"``, ...; the registered ones are in
    :data:`collectives.algorithms.ALGORITHMS`), or ``"auto"``, the default, for the
    one the selector's cost model predicts fastest (:func:`explain` says which and
    why). It must be the same on every rank.
``comm``
    the :class:`Communicator` to run on, or an mpi4py communicator (wrapped once
    and reused); by default the one over ``MPI.COMM_WORLD``.
``check``
    whether the ranks agree on the call (collective, count, dtype, op, root,
    algorithm, sequence number) before running it, and raise
    :class:`~collectives.MismatchError` on every rank if they differ; the
    communicator's setting by default (see :class:`Communicator`). The same on
    every rank.

A rank whose own checks of a call fail (a bad buffer, op, root, algorithm ...)
raises, and unless checking is off the other ranks raise
:class:`~collectives.PeerInputError` for the same call instead of waiting. No
call waits longer than the communicator's timeout
(:class:`~collectives.CollectiveTimeout`; see :mod:`collectives.watchdog`).

Each has a non-blocking twin (:mod:`collectives.nonblocking`: ``iallreduce`` ...)
that starts it and returns a :class:`~collectives.Request`; a blocking call on a
communicator waits for the calls started on it first (:mod:`collectives.requests`).

Each function hands its arguments by name to
:func:`collectives.dispatch.call_collective`, the one path: it settles the calls
started on the communicator, runs a repeated call on the decisions its first one
kept (:mod:`collectives.repeats`), and otherwise checks the arguments into a
:class:`~collectives.dispatch.CheckedCall` and agrees on the call, chooses its
algorithm and runs it.
"""

__all__ = [
    "Communicator",
    "allgather",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "explain",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import engine
from .buffers import (
    allgather_job,
    allreduce_job,
    alltoall_job,
    barrier_job,
    broadcast_job,
    deliver,
    gather_job,
    narrowed,
    reduce_job,
    reduce_scatter_job,
    scatter_job,
    widened,
)
from .communicator import Communicator, communicator_of
from .dispatch import CheckedCall, call_collective, escaped
from .explaining import explain
from .faults import PLAN as FAULTS
from .host_copy import on_host_copy
from .one_call import ELSEWHERE, repeat_barrier, repeat_rooted, repeat_shares
from .ops import ReduceOp
from .reproducible_calls import ALIASES, Through, reproducibly
from .reproducible_calls import went_on as reproducible_went_on
from .requests import busy, settle
from .selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI


_NDARRAY = np.ndarray  # a module global: an allreduce tells numpy arrays by their class at once
_EMPTY_LIKE = np.empty_like


def _engine_takes(x: Any, out: Any) -> bool:
    """Whether a call of ``x`` into ``out`` (or a new array) may be one call into the compiled engine:
    numpy arrays, the engine running, no fault armed (the full path runs those)."""
    return (
        x.__class__ is _NDARRAY
        and (out is None or out.__class__ is _NDARRAY)
        and engine.COMPILED is not None
        and not FAULTS.armed
    )


def allreduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
    reproducible: bool = False,
) -> Any:
    """Combine ``x`` element-wise across all ranks; every rank gets the result.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        op: ``sum``, ``prod``, ``min``, ``max``, ``avg`` (floating types) or
            ``band``, ``bor``, ``bxor`` (integers). ``avg`` divides the sum by the
            world size; float16 is summed and divided in float32 and rounded once,
            so that a sum past float16's largest, 65504, cannot overflow. Or a
            :class:`~collectives.Op` of the user's; a non-commutative one only on the
            algorithms that keep the ranks' order (``"auto"`` picks among them).
        out: where to put the result, of ``x``'s shape and dtype; ``out=x``
            reduces in place.
        algorithm: the algorithm's name, e.g. ``"ring"``; ``"auto"`` (the default)
            runs the one the cost model predicts fastest (see :func:`explain`).
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.
        reproducible: a float ``sum`` or ``avg`` whose bits depend only on the inputs, not on the
            algorithm or world size (numpy arrays; :mod:`collectives.reproducible_calls`).

    Returns:
        The result, ``out`` when given.
    """
    try:
        if out is x and op.__class__ is str and x.__class__ is _NDARRAY:
            # a repeat of an in-place call on numpy arrays: one call into the compiled engine, where it runs
            # (a reproducible sum's repeat kept under its op's alias: reproducible_calls.ALIASES)
            compiled = engine.COMPILED
            kept_as = op if not reproducible else ALIASES.get(op)
            if compiled is not None and kept_as is not None and not FAULTS.armed:
                if busy:
                    settle(comm)
                group = comm if comm.__class__ is Communicator else communicator_of(comm)
                # (a reproducible sum's repeat only while calls are checked: its op needs them)
                done = (
                    compiled.repeat_in_place(group.repeats, x, kept_as, algorithm, check)
                    if not reproducible or (group.watchdog.check if check is None else check)
                    else None
                )
                if done is x:
                    return x
                if done is not None:
                    lean, status = done
                    flat = x.reshape(-1)
                    if reproducible:
                        reproducible_went_on(lean, status, flat)
                    else:
                        lean.went_on(status, flat, flat)
                    return x
        elif (
            x.__class__ is _NDARRAY
            and op.__class__ is str
            and not reproducible
            and (out is None or out.__class__ is _NDARRAY)
            and engine.COMPILED is not None
            and not FAULTS.armed
        ):
            # a repeat of a call into out or into a new array: one call into the engine too
            if busy:
                settle(comm)
            group = comm if comm.__class__ is Communicator else communicator_of(comm)
            kept = group.repeats
            done = engine.COMPILED.repeat_out_of_place(kept, x, out, op, algorithm, check, _EMPTY_LIKE)
            if done is not None:
                if done.__class__ is not tuple:
                    return done
                lean, status, result = done
                lean.went_on(status, result.reshape(-1), x.reshape(-1))
                return result
        if reproducible:
            return reproducibly("allreduce", x, op, out, algorithm, comm, check, _THROUGH)
        if x.__class__ is not _NDARRAY and algorithm == AUTO:
            result = on_host_copy(x, op, out, comm, check, allreduce)
            if result is not None:
                return result
        if op == "avg" or op.__class__ is ReduceOp:
            wide = _widened(x, op, out, comm)
            if wide is not None:
                return narrowed(allreduce(wide, op, algorithm=algorithm, comm=comm, check=check), out)
        return call_collective(
            comm, "allreduce", algorithm=algorithm, check=check, checks=allreduce_job, finish=_delivered,
            x=x, out=out, op=op,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "allreduce", error)
        raise


def reduce_scatter(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
    reproducible: bool = False,
) -> Any:
    """Combine ``x`` across all ranks; each rank gets its own share of the result.

    Without ``counts``, ``x`` has ``P * k`` rows (P the world size) and rank
    ``r`` gets rows ``r * k`` to ``(r + 1) * k`` of the result, as
    ``MPI_Reduce_scatter_block`` and NCCL's reduce-scatter do. With ``counts``,
    ``x`` is taken flat and rank ``r`` gets ``counts[r]`` elements starting at
    ``sum(counts[:r])``, as ``MPI_Reduce_scatter`` does.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        op: the reduction, as for :func:`allreduce`.
        counts: the elements of each rank's share, when they differ.
        out: where to put this rank's share.
        algorithm: the algorithm's name, or ``"auto"`` (the default), as for :func:`allreduce`;
            it chooses for an even split of ``x``, whatever ``counts`` says.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.
        reproducible: the same bits whatever the algorithm or world size, as for :func:`allreduce`.

    Returns:
        This rank's share of the result, ``out`` when given.
    """
    try:
        if op.__class__ is str and op != "avg" and not reproducible and _engine_takes(x, out):
            done = repeat_shares("reduce_scatter", x, out, op, counts, algorithm, comm, check)
            if done is not None:
                return done
        if reproducible:
            return reproducibly("reduce_scatter", x, op, out, algorithm, comm, check, _THROUGH, counts=counts)
        if op == "avg" or op.__class__ is ReduceOp:
            wide = _widened(x, op, out, comm)
            if wide is not None:
                share = reduce_scatter(wide, op, counts=counts, algorithm=algorithm, comm=comm, check=check)
                return narrowed(share, out)
        return call_collective(
            comm, "reduce_scatter", algorithm=algorithm, check=check, checks=reduce_scatter_job,
            finish=_share, x=x, out=out, op=op, counts=counts,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "reduce_scatter", error)
        raise


def allgather(
    x: Any,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Concatenate every rank's ``x`` in rank order; every rank gets the whole.

    Without ``counts`` every rank passes the same shape and the result stacks
    them along the first axis (a 0-d ``x`` gives a 1-d result of P elements).
    With ``counts`` rank ``r`` passes ``counts[r]`` elements, as
    ``MPI_Allgatherv``, and the result is flat.

    Args:
        x: this rank's array.
        counts: the elements of each rank's contribution, when they differ.
        out: where to put the result.
        algorithm: the algorithm's name, or ``"auto"`` (the default), as for :func:`allreduce`;
            it chooses for an even split of the result, whatever ``counts`` says.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.

    Returns:
        The concatenation, ``out`` when given.
    """
    try:
        if _engine_takes(x, out):
            done = repeat_shares("allgather", x, out, None, counts, algorithm, comm, check)
            if done is not None:
                return done
        return call_collective(
            comm, "allgather", algorithm=algorithm, check=check, checks=allgather_job, finish=_delivered,
            x=x, out=out, counts=counts,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "allgather", error)
        raise


def broadcast(
    x: Any,
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Copy the root's ``x`` to every rank.

    Every rank passes an array of the same shape and dtype, as ``MPI_Bcast``
    asks; only the root's contents are read, the others' give the result's
    shape and dtype.

    Args:
        x: the data at the root; an array of its shape and dtype elsewhere.
        root: the rank whose ``x`` is sent.
        out: where to put the result, of ``x``'s shape and dtype; ``out=x``
            broadcasts in place, as ``MPI_Bcast`` does.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.

    Returns:
        The root's data, ``out`` when given.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    try:
        if _engine_takes(x, out):
            done = repeat_rooted("broadcast", x, out, None, root, algorithm, comm, check)
            if done is not None:
                return done
        return call_collective(
            comm, "broadcast", algorithm=algorithm, check=check, checks=broadcast_job, finish=_delivered,
            x=x, out=out, root=root,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "broadcast", error)
        raise


def reduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
    reproducible: bool = False,
) -> Any:
    """Combine ``x`` element-wise across all ranks; the root gets the result.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        op: the reduction, as for :func:`allreduce`.
        root: the rank that gets the result.
        out: where the root puts the result, of ``x``'s shape and dtype;
            ``out=x`` reduces in place. Checked on every rank, written only
            at the root.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.
        reproducible: the same bits whatever the algorithm or world size, as for :func:`allreduce`.

    Returns:
        At the root, the result (``out`` when given); ``None`` elsewhere, as
        mpi4py's ``comm.reduce``.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    try:
        if op.__class__ is str and op != "avg" and not reproducible and _engine_takes(x, out):
            done = repeat_rooted("reduce", x, out, op, root, algorithm, comm, check)
            if done is not None:
                return None if done is ELSEWHERE else done
        if reproducible:
            return reproducibly("reduce", x, op, out, algorithm, comm, check, _THROUGH, root=root)
        wide = _widened(x, op, out, comm)
        if wide is not None:
            return narrowed(reduce(wide, op, root, algorithm=algorithm, comm=comm, check=check), out)
        return call_collective(
            comm, "reduce", algorithm=algorithm, check=check, checks=reduce_job, finish=_at_root,
            x=x, out=out, op=op, root=root,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "reduce", error)
        raise


def gather(
    x: Any,
    root: int = 0,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Concatenate every rank's ``x`` in rank order at the root.

    Without ``counts`` every rank passes the same shape and the root's result
    stacks them along the first axis (a 0-d ``x`` gives P elements), as
    ``MPI_Gather``. With ``counts`` rank ``r`` passes ``counts[r]`` elements,
    as ``MPI_Gatherv``, and the result is flat.

    Args:
        x: this rank's array.
        root: the rank that gets the concatenation.
        counts: the elements of each rank's contribution, when they differ.
        out: where the root puts the result; checked on every rank, written
            only at the root.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.

    Returns:
        At the root, the concatenation (``out`` when given); ``None`` elsewhere.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    try:
        return call_collective(
            comm, "gather", algorithm=algorithm, check=check, checks=gather_job, finish=_at_root,
            x=x, out=out, root=root, counts=counts,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "gather", error)
        raise


def scatter(
    x: Any,
    root: int = 0,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Split the root's ``x`` into shares in rank order; each rank gets its own.

    Without ``counts`` ``x`` has ``P * k`` rows (P the world size) and rank
    ``r`` gets rows ``r * k`` to ``(r + 1) * k``, as ``MPI_Scatter``. With
    ``counts`` ``x`` is taken flat and rank ``r`` gets ``counts[r]`` elements
    starting at ``sum(counts[:r])``, as ``MPI_Scatterv``.

    Only the root's ``x`` is read. Elsewhere ``x`` is either ``None``, with
    ``out=`` giving this rank's share's shape and dtype, or an array of the
    root's shape and dtype whose contents are ignored, so every rank may make
    the same call.

    Args:
        x: the data at the root; ``None`` or an array of its shape elsewhere.
        root: the rank whose ``x`` is split.
        counts: the elements of each rank's share, when they differ.
        out: where to put this rank's share.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.

    Returns:
        This rank's share, ``out`` when given.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
        InvalidBufferError: the root has no ``x``, or another rank has
            neither ``x`` nor ``out``.
    """
    try:
        return call_collective(
            comm, "scatter", algorithm=algorithm, check=check, checks=scatter_job, finish=_scattered,
            x=x, out=out, root=root, counts=counts,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "scatter", error)
        raise


def alltoall(
    x: Any,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Send share ``j`` of ``x`` to rank ``j``; get every rank's share for this one, in rank order.

    ``x`` has ``P * k`` rows (P the world size) and share ``j`` is rows
    ``j * k`` to ``(j + 1) * k``. The result has ``x``'s shape, and its share
    ``i`` is rank ``i``'s share for this rank, as ``MPI_Alltoall``.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        out: where to put the result, of ``x``'s shape and dtype; ``out=x``
            exchanges in place.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        comm: the communicator; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.

    Returns:
        The shares from every rank, ``out`` when given.
    """
    try:
        return call_collective(
            comm, "alltoall", algorithm=algorithm, check=check, checks=alltoall_job, finish=_exchanged,
            x=x, out=out,
        )  # fmt: skip
    except BaseException as error:
        escaped(comm, "alltoall", error)
        raise


def barrier(
    comm: "Communicator | MPI.Comm | None" = None, *, algorithm: str = AUTO, check: bool | None = None
) -> None:
    """Return only once every rank of the communicator has called ``barrier``.

    Args:
        comm: the communicator; see :mod:`collectives.api`.
        algorithm: the algorithm's name, or ``"auto"``; see :mod:`collectives.api`.
        check: whether the ranks agree on the call first; see :mod:`collectives.api`.
    """
    try:
        if engine.COMPILED is not None and not FAULTS.armed and repeat_barrier(algorithm, comm, check):
            return
        call_collective(
            comm, "barrier", algorithm=algorithm, check=check, checks=barrier_job, finish=_nothing
        )
    except BaseException as error:
        escaped(comm, "barrier", error)
        raise


_THROUGH = Through(allreduce, reduce, reduce_scatter)  # a reproducible sum's reductions of its words

# --- what each collective returns, from the buffer with its result (``finish`` of dispatch.call_collective)


def _delivered(group: Communicator, job: CheckedCall, work: Any) -> Any:
    """The whole result (an allreduce's, all-gather's or broadcast's), divided for ``avg``."""
    if job.op is not None and job.op.averages:
        job.backend.divide(work, group.size)
    return deliver(job.backend, work, job.in_out, job.out, job.shape)


def _at_root(group: Communicator, job: CheckedCall, work: Any) -> Any:
    """A rooted reduce's or gather's result at the root; ``None`` elsewhere."""
    if group.rank != job.root:
        return None
    return _delivered(group, job, work)


def _share(group: Communicator, job: CheckedCall, share: Any) -> Any:
    """A reduce-scatter's share, divided for ``avg``, in ``job.out``."""
    if job.op is not None and job.op.averages:
        job.backend.divide(share, group.size)
    if share is not job.result:
        job.backend.copy(job.out, share)
    return job.out


def _scattered(group: Communicator, job: CheckedCall, work: Any) -> Any:
    """This rank's share of a scatter, in ``out`` or a new array."""
    shares, rank, backend = job.shares, group.rank, job.backend
    assert shares is not None  # a scatter has its shares
    lo = sum(shares[:rank])
    out = job.out
    if out is None:
        out = backend.empty(shares[rank], work).reshape(job.shape)
    backend.copy(out, work[lo : lo + shares[rank]])
    return out


def _exchanged(group: Communicator, job: CheckedCall, work: Any) -> Any:
    """An all-to-all's shares from every rank, in ``out`` or a new array."""
    result = work[job.count :]
    if job.out is None:
        return result.reshape(job.shape)
    job.backend.copy(job.out, result)
    return job.out


def _nothing(group: Communicator, job: CheckedCall, work: Any) -> None:
    """A barrier returns nothing."""


def _widened(x: Any, op: "str | ReduceOp", out: Any, comm: "Communicator | MPI.Comm | None") -> Any | None:
    """``x`` in float32 for a float16 ``avg`` (:func:`~collectives.buffers.widened`), else ``None``.

    The calls started on the communicator go first, as in :func:`~collectives.dispatch.call_collective`:
    they may still write ``x``.
    """
    if busy:
        settle(comm)
    return widened(x, op, out)
