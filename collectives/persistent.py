"""Persistent collectives (``allreduce_init`` ...): checks, choice and agreement once, then many starts.

As MPI 4's ``MPI_Allreduce_init``: ``p = allreduce_init(x, out=x, comm=comm)``
checks the arguments, agrees on the call with the other ranks (collective: every
rank calls it, in the same order as its other collectives) and chooses the
algorithm; then each ``p()``, or ``p.start()`` ... ``p.wait()``, runs the
collective on the buffers' contents at that moment and returns the result (the
same array every time: ``out``, or one made at init).

A start keeps the safeties of a plain call: it claims the communicator against
other threads, is numbered, and unless checking is off its signature (with that
number) is compared with the other ranks', so a start that meets another call on
another rank raises :class:`~collectives.MismatchError` on every rank instead of
pairing wrong data; every wait is bounded by the communicator's timeout, so a rank
that never starts leaves the others a :class:`~collectives.CollectiveTimeout`.

An allreduce on one node's shared memory starts on the lean path
(:mod:`collectives.lean`): its signature travels with the executor's one barrier;
starts in a row share one flight-recorder entry (their first and last numbers, and
how many); and a start gets a Call of its own, with its deadline and stall warning,
only where it waits past 1 ms or fails. With ``$COLLECTIVES_DEBUG`` or an armed
``$COLLECTIVES_FAULT``, and for every other call, a start runs the plain call, on
the decisions its init's agreement made.
"""

__all__ = ["Persistent", "allgather_init", "allreduce_init", "broadcast_init", "reduce_scatter_init"]

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import api
from .buffers import allgather_job, allreduce_job, broadcast_job, reduce_scatter_job
from .call import Starts
from .communicator import Communicator, communicator_of
from .dispatch import CallArguments, CheckedCall, checked, decide, escaped
from .engine import DONE
from .errors import FreedCommunicatorError, InvalidBufferError, PersistentStateError
from .faults import PLAN as FAULTS
from .host_copy import through_host
from .lean import LeanAllreduce
from .ops import ReduceOp
from .reproducible_calls import check_call, plain_op
from .requests import Request, settle, start
from .requests import busy as started
from .selector import AUTO
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from mpi4py import MPI

    from .execute_shared import SharedExecutor


class Persistent:
    """A collective checked and agreed on once, run by each :meth:`start` (or call) on its buffers.

    Attributes:
        collective: the collective's name.
        algorithm: the algorithm its starts run (a name, not ``"auto"``).
        starts: how many times it has started.
    """

    __slots__ = (
        "_arrays",
        "_group",
        "_lean",
        "_plain",
        "_request",
        "_result",
        "_source",
        "_work",
        "algorithm",
        "collective",
        "rebinder",
        "starts",
    )

    def __init__(
        self,
        collective: str,
        group: Communicator,
        algorithm: str,
        plain: Callable[[], Any],
        arrays: Sequence[Any],
    ) -> None:
        _unfreed(group, "this")
        self.collective = collective
        self.algorithm = algorithm
        self.starts = 0
        self._group = group
        self._plain = plain
        self._lean: LeanAllreduce | None = None
        self._work: Any = None
        self._source: Any = None
        self._result: Any = None
        self._request: Request | None = None
        self.rebinder: Callable[[Any, Any, CheckedCall | None], None] | None = None
        distinct = [a for i, a in enumerate(arrays) if a is not None and all(a is not b for b in arrays[:i])]
        self._arrays = tuple((a, a.shape, a.dtype) for a in distinct)

    def __call__(self) -> Any:
        """Run the collective now on the buffers' contents; its result (the same array every start).

        Raises:
            PersistentStateError: a :meth:`start` is waiting for its :meth:`wait`.
            InvalidBufferError: a buffer's shape or dtype changed since the init.
        """
        try:
            if self._request is not None:
                raise PersistentStateError(
                    f"persistent {self.collective} was started and not waited for; call wait() first"
                )
            for array, shape, dtype in self._arrays:  # _fits inline: a tenth of a small start
                if array.shape != shape or (array.dtype is not dtype and array.dtype != dtype):
                    self._fits()
            if started:  # calls started on some communicator: those on this one go first
                settle(self._group)
            self.starts += 1
            lean = self._lean
            if lean is not None and not FAULTS.armed and not lean.watchdog.debug:
                status = lean.start(self._work, self._source)  # lean.run, written out: a tenth of a start
                if status != DONE:
                    lean.went_on(status, self._work, self._source)
                return self._result
            return self._plain()
        except BaseException as error:
            escaped(self._group, self.collective, error)
            raise

    def start(self) -> None:
        """Start the collective on the buffers' contents now; :meth:`wait` for its result.

        The buffers belong to the call until :meth:`wait` returns, as a non-blocking
        call's do (:mod:`collectives.nonblocking`).

        Raises:
            PersistentStateError: it was started already and not waited for.
            FreedCommunicatorError: its communicator was freed.
            InvalidBufferError: a buffer's shape or dtype changed since the init.
        """
        if self._request is not None:
            raise PersistentStateError(
                f"persistent {self.collective} was started twice without a wait; call wait() first"
            )
        _unfreed(self._group, f"persistent {self.collective}'s")
        self._fits()
        self.starts += 1
        lean = self._lean
        run = self._plain
        if lean is not None and not FAULTS.armed and not lean.watchdog.debug:
            run = self._lean_run
        self._request = start(self._group, self.collective, lambda group: run())

    def wait(self) -> Any:
        """Wait for the started collective; its result. Bounded by the communicator's timeout.

        Raises:
            PersistentStateError: it was not started.
            Exception: the call's error, if it failed.
        """
        request = self._request
        if request is None:
            raise PersistentStateError(f"persistent {self.collective} was not started; call start() first")
        self._request = None
        return request.wait()

    def test(self) -> bool:
        """Whether the started collective has completed (then :meth:`wait` returns at once)."""
        request = self._request
        if request is None:
            raise PersistentStateError(f"persistent {self.collective} was not started; call start() first")
        return request.test()

    def rebind(self, x: Any, out: Any = None) -> None:
        """Run the later starts on ``x`` (and ``out``) instead: buffers of the init's shapes and dtypes.

        Local, not collective: the ranks agreed on shapes and dtypes, not on where
        the buffers lie, so each may rebind its own alone (a training loop's
        buckets whose memory moved). An allreduce's only; ``out`` as at the init
        (none for one in place, or to keep the result array made there).

        Raises:
            PersistentStateError: it is started, or not an allreduce.
            InvalidBufferError: a buffer is not of the init's shape and dtype, or fails the init's checks.
        """
        if self._request is not None:
            raise PersistentStateError(f"persistent {self.collective} is started; wait() before rebind()")
        if self.rebinder is None:
            raise PersistentStateError(f"persistent {self.collective} cannot be rebound; make a new one")
        self.rebinder(x, out, None)

    def bound(
        self, arrays: Sequence[Any], lean: LeanAllreduce | None = None, work: Any = None, source: Any = None
    ) -> None:
        """Take ``arrays`` as the buffers to check at each start (the last is the result).

        ``lean`` runs the starts on ``work`` and ``source``; without it each runs the plain call.
        """
        distinct = [a for i, a in enumerate(arrays) if a is not None and all(a is not b for b in arrays[:i])]
        self._arrays = tuple((a, a.shape, a.dtype) for a in distinct)
        self._lean, self._work, self._source, self._result = lean, work, source, arrays[-1]

    def _lean_run(self) -> Any:
        lean = self._lean
        assert lean is not None  # only started so with its lean path
        lean.run(self._work, self._source)
        return self._result

    @property
    def lean(self) -> bool:
        """Whether its starts take the lean shared-memory path (else each runs the plain call)."""
        return self._lean is not None

    @property
    def active(self) -> bool:
        """Whether it was started and not yet waited for."""
        return self._request is not None

    def _fits(self) -> None:
        """Raise if a buffer was reshaped or given another dtype since the init."""
        for array, shape, dtype in self._arrays:
            # the dtype is the very object in all but odd cases: the identity first, 0.1 us a start
            if array.shape != shape or (array.dtype is not dtype and array.dtype != dtype):
                raise InvalidBufferError(
                    f"persistent {self.collective}: a buffer of shape {shape} and dtype {dtype} at init is "
                    f"now of shape {array.shape} and dtype {array.dtype}; make a new one with the *_init call"
                )

    def __repr__(self) -> str:
        state = "started" if self._request is not None else "inactive"
        return f"<Persistent {self.collective} {self.algorithm} {state}, {self.starts} starts>"


def _unfreed(group: Communicator, whose: str) -> None:
    """Raise unless ``group`` is usable: a persistent call made or started on a freed one fails at once."""
    if group.watchdog.freed:
        raise FreedCommunicatorError(f"rank {group.rank}: {whose} communicator was freed; make a new one")


def _decided(
    group: Communicator,
    collective: str,
    *,
    algorithm: str,
    check: bool | None,
    checks: Callable[[Communicator, str, CallArguments], CheckedCall],
    **arguments: Any,
) -> "tuple[CheckedCall, str, SharedExecutor | None, PackedSignature]":
    """An init's call, checked by ``checks``, and what the ranks agreed on; ``arguments``: the call's.

    Returns:
        The job; the algorithm its starts run; the shared-memory executor, where it
        runs them; the packed signature of the starts (see :func:`~collectives.dispatch.decide`).
    """
    given = CallArguments(**arguments)
    checking = lambda: checks(group, algorithm, given)  # noqa: E731
    job = checked(group, collective, checking, algorithm=algorithm, check=check)
    return (job, *decide(group, job, check))


def _keeping(run: Callable[[Any], Any], out: Any) -> Callable[[], Any]:
    """A start that runs ``run(into)``: into ``out`` first, then into the first start's result."""
    target = [out]

    def plain() -> Any:
        result = target[0] = run(target[0])  # later starts write into the first one's result
        return result

    return plain


def allreduce_init(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
    reproducible: bool = False,
) -> Persistent:
    """A persistent :func:`~collectives.allreduce` of ``x`` into ``out``; collective.

    Arguments as for :func:`~collectives.allreduce`. Without ``out`` the result
    goes to an array made here, returned by every start. With ``reproducible``, a
    start runs the reproducible sum, whose reductions agree at each start.

    Raises:
        MismatchError: on every rank, when the ranks' inits differ.
    """
    group = communicator_of(comm)
    settle(group)  # the calls started on it go first
    if reproducible:
        made = _reproducible("allreduce", group, x, op, None, out, algorithm, check)
        if made is not None:
            return made
    in_place = out is x
    if out is None and hasattr(x, "shape") and hasattr(x, "dtype"):
        out = checked(group, "allreduce", lambda: _like(x), algorithm=algorithm, check=check)
    job, chosen, executor, guard = _decided(
        group, "allreduce", algorithm=algorithm, check=check, checks=allreduce_job, x=x, op=op, out=out
    )
    buffers = [x, out]
    # a start runs the init's choice; a small "auto" one of device arrays keeps the plain call's host copy
    nbytes = job.count * job.item_bytes
    on_host = through_host("allreduce", algorithm, nbytes) and job.backend.device() is not None
    started_as = algorithm if on_host else chosen

    def plain() -> Any:
        return api.allreduce(buffers[0], op, out=buffers[1], algorithm=started_as, comm=group, check=check)

    persistent = Persistent("allreduce", group, chosen, plain, (x, out))

    def bind(new: Any, new_out: Any, job: CheckedCall | None) -> None:
        """Point the starts at ``new`` and ``new_out``, of the init's shapes and dtypes (checked locally)."""
        if job is None:
            if new_out is None:
                new_out = new if in_place else out
            for was, now in ((x, new), (out, new_out)):
                shape, dtype = getattr(now, "shape", None), getattr(now, "dtype", None)
                if shape != was.shape or dtype != was.dtype:
                    raise InvalidBufferError(
                        f"persistent allreduce: rebind to a buffer of shape {shape} and dtype {dtype}; "
                        f"the init's is of shape {was.shape} and dtype {was.dtype}"
                    )
            job = allreduce_job(group, algorithm, CallArguments(x=new, op=op, out=new_out))
        buffers[:] = [new, new_out]
        lean = (
            executor is not None
            and job.backend.name == "numpy"
            and job.in_out
            and (new_out is new or job.source is not None)
            and group.watchdog.shared is not None
            and job.collective == "allreduce"
        )
        path = None
        reduction = job.op
        if lean and executor is not None and reduction is not None:
            path = LeanAllreduce(group, executor, guard, check, job.backend, reduction, chosen, Starts)
        source = job.work if job.source is None else job.source
        persistent.bound((new, new_out), path, job.work, source)

    bind(x, out, job)
    persistent.rebinder = bind
    return persistent


def _reproducible(
    collective: str,
    group: Communicator,
    x: Any,
    op: "str | ReduceOp",
    counts: Sequence[int] | None,
    out: Any,
    algorithm: str,
    check: bool | None,
) -> Persistent | None:
    """A persistent reproducible sum (``None`` for integers, whose plain init serves): checked here;
    each start runs the reproducible call into ``out`` (made here when not given).

    Two ranks' float32 or float64 sum, and that of the ranks of one node where their shared memory
    was set up, is the plain init with the op that sums every rank's contribution reproducibly (its
    starts on the plain call's path; :attr:`Persistent.algorithm` its choice). Elsewhere
    :attr:`Persistent.algorithm` names the algorithm of each of the call's collectives, as the
    communicator chooses them (``explain(..., reproducible=True)``'s steps; the caller's
    ``algorithm`` for the one that sums, where it names one).
    """
    checks = checked(
        group, collective, lambda: check_call(collective, x, op, out, group, 0, counts),
        algorithm=algorithm, check=check,
    )  # fmt: skip
    if checks is None:
        return None
    summing = plain_op(x, op, out, group, check, algorithm) if group.size > 1 else None
    if summing is not None and collective == "allreduce":
        return allreduce_init(x, summing[0], out=out, algorithm=summing[1], comm=group, check=check)
    if summing is not None and (out is None or out.flags.c_contiguous):
        return reduce_scatter_init(
            x, summing[0], counts=counts, out=out, algorithm=summing[1], comm=group, check=check
        )
    if out is None:
        out = np.empty(checks[3], x.dtype)
    extra = {"counts": counts} if collective == "reduce_scatter" else {}
    run = getattr(api, collective)

    def plain() -> Any:
        return run(x, op, out=out, algorithm=algorithm, comm=group, check=check, reproducible=True, **extra)

    names = _algorithms(group, collective, x, checks[1], algorithm)
    return Persistent(collective, group, names, plain, (x, out))


def _algorithms(group: Communicator, collective: str, x: Any, op: str, algorithm: str) -> str:
    """The algorithm of each collective of a reproducible call on ``group``, as ``"step: name, ..."``.

    Collective: the communicator's node split is found first where no call found it yet,
    so that the choices are the ones its calls make.
    """
    if group.size > 1:
        group.features  # noqa: B018 (collective: every rank's init asks it at once)
    cost = api.explain(collective, x.size, x.dtype, comm=group, op=op, reproducible=True).reproducible
    summing = ("contributions gathered", "words summed")
    named = [
        f"{step.name}: {algorithm if algorithm != AUTO and step.name in summing else step.algorithm}"
        for step in (() if cost is None else cost.steps)
        if step.algorithm is not None
    ]
    return ", ".join(named) or "none (one rank: no collective)"


def _like(x: Any) -> Any:
    """A result array of ``x``'s shape and dtype (an allreduce's, when the init has no ``out``)."""
    from .backends import backend_for

    return backend_for(x).empty(x.size, x).reshape(x.shape)


def reduce_scatter_init(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
    reproducible: bool = False,
) -> Persistent:
    """A persistent :func:`~collectives.reduce_scatter`; collective. Arguments as for it."""
    group = communicator_of(comm)
    settle(group)  # the calls started on it go first
    if reproducible:
        made = _reproducible("reduce_scatter", group, x, op, counts, out, algorithm, check)
        if made is not None:
            return made
    job, chosen, _, _ = _decided(
        group, "reduce_scatter", algorithm=algorithm, check=check, checks=reduce_scatter_job,
        x=x, op=op, counts=counts, out=out,
    )  # fmt: skip
    share = job.out  # this rank's share, made by the checks when not given

    def plain() -> Any:
        return api.reduce_scatter(x, op, counts=counts, out=share, algorithm=chosen, comm=group, check=check)

    return Persistent("reduce_scatter", group, chosen, plain, (x, share))


def allgather_init(
    x: Any,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Persistent:
    """A persistent :func:`~collectives.allgather`; collective. Arguments as for it."""
    group = communicator_of(comm)
    settle(group)  # the calls started on it go first
    _, chosen, _, _ = _decided(
        group, "allgather", algorithm=algorithm, check=check, checks=allgather_job,
        x=x, counts=counts, out=out,
    )  # fmt: skip

    def run(into: Any) -> Any:
        return api.allgather(x, counts=counts, out=into, algorithm=chosen, comm=group, check=check)

    return Persistent("allgather", group, chosen, _keeping(run, out), (x, out))


def broadcast_init(
    x: Any,
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Persistent:
    """A persistent :func:`~collectives.broadcast`; collective. Arguments as for it."""
    group = communicator_of(comm)
    settle(group)  # the calls started on it go first
    _, chosen, _, _ = _decided(
        group, "broadcast", algorithm=algorithm, check=check, checks=broadcast_job, x=x, root=root, out=out
    )

    def run(into: Any) -> Any:
        return api.broadcast(x, root, out=into, algorithm=chosen, comm=group, check=check)

    return Persistent("broadcast", group, chosen, _keeping(run, out), (x, out))
