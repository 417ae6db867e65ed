"""Routes one call to a schedule, the shared-memory executor or the node hierarchy, under the watchdog.

Every collective of :mod:`collectives.api` takes the same path, :func:`call_collective`:
the calls started on the communicator go first; the repeat room
(:mod:`collectives.repeats`) is asked once for the call's ready repeat, which runs
it on the decisions an earlier call of its key made; any other call has its
arguments checked into a :class:`CheckedCall` (:func:`checked`, the one refusal:
it tells the other ranks if the checks fail), then :func:`run` agrees on the call
with the other ranks, chooses its algorithm and runs it under the watchdog, keeping
its decisions in the repeat room's place for them where a later call can reuse them.
"""

__all__ = [
    "CallArguments",
    "CheckedCall",
    "call_collective",
    "checked",
    "decide",
    "escaped",
    "keeps_order",
    "run",
]

from collections.abc import Callable, Sequence
from dataclasses import KW_ONLY, dataclass
from functools import lru_cache, partial
from typing import TYPE_CHECKING, Any, TypeVar

from .algorithms import ALGORITHMS, rank_program
from .algorithms.base import implements, required_feature
from .backends import ArrayBackend
from .call import Call
from .chunking import even_split
from .communicator import Communicator, communicator_of, made_for
from .dispatch_shared import keep_shared, run_shared
from .early_plan import EarlyPlan, allreduce_plan, early_plan
from .errors import CollectivesError, MismatchError, UnsupportedOpError
from .execute import execute
from .execute import run as run_plan
from .execute_shared import SharedExecutor
from .ops import ReduceOp, get_op, itemsize
from .ordering import keeps_rank_order
from .repeats import Repeat, RepeatedAllreduce, find_repeat
from .requests import busy, settle
from .selector import AUTO, Selector
from .transport.base import SharedMemory
from .watchdog import PackedSignature

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")

_BOR = get_op("bor")  # the barrier's tokens combine by it


@dataclass(frozen=True, slots=True, kw_only=True)
class CallArguments:
    """A collective call's arguments as the user gave them, for its checks (the defaults: not its own).

    Attributes:
        x: this rank's input.
        out: where the result goes.
        op: the reduction, of the collectives that reduce.
        root: the root of a rooted collective.
        counts: the elements of each rank's share, where they differ.
    """

    x: Any = None
    out: Any = None
    op: "str | ReduceOp | None" = None
    root: int = -1
    counts: Sequence[int] | None = None


@dataclass(slots=True, eq=False)
class CheckedCall:
    """One call with its arguments checked: what :func:`run` agrees on, routes and runs.

    Attributes:
        collective: the collective's name.
        algorithm: the algorithm asked for: a name, or ``"auto"``.
        backend: the arrays' backend.
        op: the reduction, of the collectives that reduce.
        item_bytes: bytes per element.
        count: elements of the schedule's buffer, as the signature gives them.
        dtype: the arrays' dtype, as the signature gives it; ``""`` for the barrier,
            which moves no data of the caller's (nor names its backend).
        work: the buffer the schedule runs on; ``None`` where :func:`run` makes it
            (a reduce-scatter's copy of its input, the barrier's tokens).
        source: where the schedule reads this rank's input, when not from ``work``.
        root: the root of a rooted collective, else -1.
        counts: the elements of each rank's share, as the caller gave them.
        shares: the elements of each rank's share, for the schedule.
        shape: the result's shape, as a repeated call's decisions keep it.
        on_shared: whether the shared-memory executor can run the call, where its
            algorithm asks for it (an allreduce, all-gather, or reduce-scatter of a
            contiguous input; a broadcast, reduce or barrier).
        result: where the shared-memory executor puts a reduce-scatter's share
            (``None``: in a buffer of its own).
        out: where the caller wants the result (``None``: a new array).
        in_out: whether ``work`` is ``out`` itself.
        copied: whether this rank's input was copied into ``work`` first (a
            repeat runs without that copy, so only a call without one is kept).
        repeat: where the call keeps the decisions a later call of its key may
            reuse (see :mod:`collectives.repeats`); ``None`` for others.
        early: an allreduce's decisions made before its ranks agree on the call
            (see :mod:`collectives.early_plan`).
    """

    collective: str
    algorithm: str
    backend: ArrayBackend
    op: ReduceOp | None
    item_bytes: int
    count: int
    dtype: str
    work: Any
    _: KW_ONLY
    source: Any = None
    root: int = -1
    counts: Sequence[int] | None = None
    shares: tuple[int, ...] | None = None
    shape: tuple[int, ...] = ()
    on_shared: bool = False
    result: Any = None
    repeat: Repeat | None = None
    early: EarlyPlan | None = None
    out: Any = None
    in_out: bool = False
    copied: bool = False


def escaped(comm: "Communicator | MPI.Comm | None", collective: str, error: BaseException) -> None:
    """Account for ``error`` leaving a public call of ``collective`` on ``comm``; the caller re-raises it.

    Every public collective's body is one ``try`` whose handler calls this, so an
    error from anywhere between its first line and its return (a
    ``KeyboardInterrupt`` included) is either one the watchdog ended the call with,
    or breaks the communicator on every rank (:meth:`Watchdog.escaped`): a rank
    never stays a call behind or ahead of its peers.
    """
    group = made_for(comm)
    if group is not None:
        group.watchdog.escaped(collective, error)


def checked(
    group: Communicator | None,
    collective: str,
    checks: Callable[[], T],
    *,
    algorithm: object = AUTO,
    check: bool | None = None,
    place: "Callable[[Callable[[Communicator], None]], object] | None" = None,
) -> T:
    """``checks()``, a call's checks on this rank; if they raise, the other ranks are told (theirs raise too).

    The one way a rank refuses a call before it runs. Every error is told, the
    library's own and any other (a foreign array's protocol failing, memory for
    the workspace), since the other ranks would otherwise wait for the timeout:
    as a poisoned signature in the call's place among the communicator's calls
    (:meth:`~collectives.watchdog.Watchdog.poison`). Then the error goes on.

    Args:
        group: the communicator told, at once; ``None`` with ``place``.
        place: where the news (a job on a communicator) goes instead: a job
            thread's call is refused there, after the jobs before it, a named
            one under its name; it may tell no one (a torch call off this library).
    """
    try:
        return checks()
    except Exception as error:
        news = partial(_refusal, collective=collective, algorithm=algorithm, error=error, check=check)
        if place is not None:
            place(news)
        elif group is not None:
            news(group)
        raise


def _refusal(
    group: Communicator, *, collective: str, algorithm: object, error: BaseException, check: bool | None
) -> None:
    group.watchdog.poison(collective, algorithm, error, check)


def call_collective(
    comm: "Communicator | MPI.Comm | None",
    collective: str,
    *,
    algorithm: str,
    check: bool | None,
    checks: Callable[[Communicator, str, CallArguments], CheckedCall],
    finish: Callable[[Communicator, CheckedCall, Any], Any],
    x: Any = None,
    out: Any = None,
    op: "str | ReduceOp | None" = None,
    root: int = -1,
    counts: Sequence[int] | None = None,
) -> Any:
    """Run one call of ``collective``: the one entry of every function of :mod:`collectives.api`.

    The calls started on the communicator (:mod:`collectives.requests`) go first.
    The repeat room is asked once for the call's ready repeat
    (:func:`~collectives.repeats.find_repeat`): one whose arrays ``x`` and ``out``
    pass its first call's checks runs on its decisions. Any other is checked into
    a :class:`CheckedCall` by ``checks(group, algorithm, given)``, ``given`` its
    :class:`CallArguments` (the other ranks are told if that raises), and run by
    :func:`run`; ``finish(group, job, work)`` turns the buffer with its result
    into what the caller returns.

    Returns:
        The call's result.
    """
    if busy:  # started calls on some communicator: those on this one go first
        settle(comm)
    group = comm if comm.__class__ is Communicator else communicator_of(comm)
    repeat = find_repeat(group, collective, x, out, op, counts, algorithm, check, root)
    if repeat is not None and repeat.fits(x, out):
        return repeat.run(group, x, out, check)
    given = CallArguments(x=x, out=out, op=op, root=root, counts=counts)
    checking = lambda: checks(group, algorithm, given)  # noqa: E731
    job = checked(group, collective, checking, algorithm=algorithm, check=check)
    if collective == "allreduce" and job.backend.device() is None:
        # decisions made before the ranks agree, where they can be: its first messages go with the signature
        early = lambda: _early(group, job, check)  # noqa: E731
        job.early = checked(group, collective, early, algorithm=algorithm, check=check)
    job.repeat = repeat
    return finish(group, job, run(group, job, check))


def _early(group: Communicator, job: CheckedCall, check: bool | None) -> EarlyPlan | None:
    """An allreduce's decisions before its ranks agree, and its first messages (see :mod:`.early_plan`)."""
    assert job.op is not None  # an allreduce reduces
    return early_plan(
        group, check=check, algorithm=job.algorithm, backend=job.backend, op=job.op, work=job.work,
        source=job.source, item_bytes=job.item_bytes,
    )  # fmt: skip


def run(group: Communicator, job: CheckedCall, check: bool | None) -> Any:
    """Agree on ``job``'s call with the other ranks, choose its algorithm and run it, under the watchdog.

    The call runs on the shared-memory executor where its algorithm needs the
    node's shared memory and the arrays are numpy's; an allreduce whose algorithm
    needs several nodes' memory runs through the node hierarchy; any other runs
    its algorithm's schedule on the executor, over the device path for device arrays.
    Where ``job.repeat`` is given and a later call can run on its decisions, they are kept there.

    Returns:
        The buffer with this rank's result: ``job.work``, or a reduce-scatter's share.

    Raises:
        MismatchError: on every rank, when their calls differ.
        CollectiveTimeout: the call did not complete in time.
    """
    early = job.early
    guard = _guard(group, job) if early is None else early.guard
    try:
        first_barrier = early is not None and early.plan is None
        with group.watchdog.watch(guard, check, first_barrier=first_barrier, keeps=job) as call:
            device = _on_device(group, call, job.backend)
            if early is None:
                call.algorithm = _algorithm_for(group, call, job, device)
                if group.tuner is not None and group.tuner.timing:
                    job.repeat = None  # a trial: the fast path must come back to the tuner
                shared = _shared(group, call, job)
            else:
                call.algorithm = early.algorithm
                shared = group.shared if early.plan is None else None
            if shared is not None:
                result = run_shared(group, call, shared, job, check)
                if job.repeat is not None:
                    keep_shared(
                        group, call, job, result, shared=shared, guard=guard, check=check,
                        repeatable=_repeatable(job),
                    )  # fmt: skip
                return result
            if job.collective == "allreduce":
                _allreduce(group, call, guard, job)
                return job.work
            return _schedule(group, call, job)
    except MismatchError as error:
        if job.op is not None and job.op.custom:
            op = job.op
            error.add_note(f"rank {group.rank}'s op {op.name!r} is {op.agreed_name!r} in the signature")
        raise
    finally:
        if group.tuner is not None:
            group.tuner.finish()  # a trial's time: the whole call, as its caller meets it


def decide(
    group: Communicator, job: CheckedCall, check: bool | None
) -> tuple[str, SharedExecutor | None, PackedSignature]:
    """Agree on ``job``'s call and choose its algorithm without running it: a persistent call's init.

    Collective. The ranks agree on a signature naming the collective with
    ``_init`` after it, so that an init never pairs with a plain call.

    Returns:
        The algorithm (a name, not ``"auto"``); the shared-memory executor, where
        it runs the call; the packed signature of the call's starts.

    Raises:
        MismatchError: on every rank, when their calls differ.
    """
    job.early = None  # its first messages, if packed already, are the init's data, not a start's
    signature = _guard(group, job).signature
    init = group.watchdog.signature_of(
        f"{job.collective}_init", job.algorithm, signature.count, signature.dtype, signature.op,
        signature.root, signature.counts, backend=signature.backend,
    )  # fmt: skip
    with group.watchdog.watch(init, check) as call:
        device = _on_device(group, call, job.backend)
        algorithm = call.algorithm = _algorithm_for(group, call, job, device)
        shared = None if device else _shared(group, call, job)
    # a start signs the algorithm it runs, on the lean path as on the plain call
    start = group.watchdog.signature_of(
        job.collective, algorithm, signature.count, signature.dtype, signature.op,
        signature.root, signature.counts, backend=signature.backend,
    )  # fmt: skip
    return algorithm, shared, start


def _algorithm_for(group: Communicator, call: Call, job: CheckedCall, device: bool) -> str:
    """The algorithm ``job`` runs, agreed under ``call``; one keeping rank order for a non-commutative op."""
    if job.op is not None and not job.op.commutative and group.size > 1:
        return _choose_ordered(group, call, job, device)
    return _choose(group, call, job.collective, job.algorithm, job.count, job.item_bytes, device)


def _guard(group: Communicator, job: CheckedCall) -> PackedSignature:
    """The packed signature of ``job``'s call."""
    counts = None if job.counts is None else tuple(int(c) for c in job.counts)
    op = "" if job.op is None else job.op.agreed_name
    backend = job.backend.name if job.dtype else ""
    return group.watchdog.signature_of(
        job.collective, job.algorithm, job.count, job.dtype, op, job.root, counts, backend=backend
    )


def _on_device(group: Communicator, call: Call, backend: ArrayBackend) -> bool:
    """Send the call's messages over the communicator's device path if ``backend`` has a device."""
    path = group.device_path_of(backend, call)
    if path is None:
        return False
    call.run_on(path.transport)
    return True


def _choose(
    group: Communicator,
    call: Call,
    collective: str,
    algorithm: str,
    count: int,
    item_bytes: int,
    device: bool,
) -> str:
    """``algorithm``, or the selector's choice for ``"auto"``, agreed with the other ranks under ``call``.

    Device arrays never use the host's shared memory, so the selector is not offered it for them.
    Where the communicator tunes online, its tuner decides (a trial, or the measured fastest).
    """
    if algorithm != AUTO:
        return algorithm
    features = frozenset() if device else group.features_in(call)
    selector = group.agreed_selector(call)
    if group.tuner is not None:
        return group.tuner.choose(call, group.transport, selector, collective, count, item_bytes, features)
    return selector.choose(collective, group.size, count, item_bytes, features)


def _choose_ordered(group: Communicator, call: Call, job: CheckedCall, device: bool) -> str:
    """As :func:`_choose`, for a non-commutative op: only an algorithm that keeps the ranks' order.

    ``"auto"`` takes the fastest of those; where no reduce algorithm keeps the
    order at the call's root, the fastest allreduce that does runs instead (the
    root keeps its result; ``job`` becomes an allreduce). A named algorithm that
    does not keep the order raises, on every rank alike (the ranks agreed on the
    call), naming those that do.

    Raises:
        UnsupportedOpError: no algorithm asked for or available keeps the order.
    """
    op, collective, size = job.op, job.collective, group.size
    assert op is not None  # only called for calls that reduce
    shares = job.shares if collective == "reduce_scatter" else None
    root = max(job.root, 0)
    numpy = not device and job.backend.name == "numpy"
    if job.algorithm != AUTO:
        needs = required_feature(ALGORITHMS[job.algorithm])
        features = group.features_in(call) if needs is not None and numpy else frozenset()
        route = (job.on_shared and numpy, features)
        if keeps_order(collective, job.algorithm, size, job.count, shares, root, *route):
            return job.algorithm
        # every rank is here alike, so asking for the features (collective, the first time) is safe
        route = (job.on_shared and numpy, group.features_in(call) if numpy else frozenset())
        ordered = [
            name
            for name in ALGORITHMS
            if keeps_order(collective, name, size, job.count, shares, root, *route, quiet=True)
        ]
        raise UnsupportedOpError(
            f"op {op.name!r} is not commutative, and algorithm {job.algorithm!r} combines the ranks' "
            f"contributions out of rank order in {collective} of {job.count} elements over {size} "
            f"ranks; algorithms that keep the order there: {', '.join(ordered) or 'none'} (or 'auto')"
        )
    features = frozenset() if device else group.features_in(call)
    selector = group.agreed_selector(call)
    on_shared = job.on_shared and numpy
    choice = _fastest_ordered(
        selector, collective, size, job.count, job.dtype, shares, root, on_shared, features
    )
    if choice is None:
        raise UnsupportedOpError(
            f"op {op.name!r} is not commutative, and no algorithm available for {collective} of {job.count} "
            f"elements over {size} ranks combines the ranks' contributions in rank order"
        )
    job.collective, algorithm = choice
    return algorithm


@lru_cache(maxsize=1024)
def _fastest_ordered(
    selector: Selector,
    collective: str,
    size: int,
    count: int,
    dtype: str,
    shares: tuple[int, ...] | None,
    root: int,
    on_shared: bool,
    features: frozenset[str],
) -> tuple[str, str] | None:
    """The collective and fastest algorithm ``selector`` offers that keep the ranks' order (memoized).

    A reduce no reduce algorithm keeps in order at ``root`` runs as an allreduce.
    """
    for chosen in (collective, "allreduce") if collective == "reduce" else (collective,):
        explanation = selector.explain(chosen, count, dtype, world_size=size, features=features)
        for candidate in explanation.candidates:  # fastest first
            on = on_shared and chosen == collective
            if keeps_order(chosen, candidate.algorithm, size, count, shares, root, on, features):
                return chosen, candidate.algorithm
    return None


def keeps_order(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    shares: tuple[int, ...] | None,
    root: int,
    on_shared: bool,
    features: frozenset[str],
    *,
    quiet: bool = False,
) -> bool:
    """Whether ``algorithm`` runs the call combining the ranks' contributions in rank order.

    The shared-memory executor (where the call runs on it: ``on_shared``, numpy
    arrays, with the feature in ``features``) reduces every element in rank
    order; the node hierarchy does not (a node's ranks need not be consecutive);
    a schedule is checked on symbolic chunks (:func:`keeps_rank_order`).
    ``quiet``: a name that does not implement the collective is no error, just not one.
    """
    module = ALGORITHMS[algorithm]
    if not implements(module, collective):
        return False
    needs = required_feature(module)
    if needs is not None and needs in features:
        if needs == "shared_memory" and on_shared:
            return True
        if needs == "shared_memory_nodes" and collective == "allreduce":
            return False
    try:
        return keeps_rank_order(collective, algorithm, size, count, shares, root)
    except (CollectivesError, ValueError):
        if quiet:
            return False
        raise


def _needs(group: Communicator, call: Call, algorithm: str, backend: ArrayBackend, feature: str) -> bool:
    """Whether ``algorithm`` declares it needs ``feature``, and the communicator has it for ``backend``."""
    needs = required_feature(ALGORITHMS[algorithm])
    return needs == feature and backend.name == "numpy" and needs in group.features_in(call)


def _shared(group: Communicator, call: Call, job: CheckedCall) -> SharedExecutor | None:
    """The shared-memory executor, when the call's algorithm needs shared memory and it can run the call."""
    if not job.on_shared or not _needs(group, call, call.algorithm, job.backend, "shared_memory"):
        return None
    return group.shared


def _schedule(group: Communicator, call: Call, job: CheckedCall) -> Any:
    """Run the call's algorithm's schedule on the executor; the buffer with this rank's result."""
    collective, backend, op, shares = job.collective, job.backend, job.op, job.shares
    program = rank_program(
        collective, call.algorithm, group.size, job.count, shares, root=max(job.root, 0), rank=group.rank
    )
    work = job.work
    if collective == "barrier":  # tokens: host bytes, whatever library the user's arrays are from
        import numpy as np

        work, op = np.zeros(program.count, np.uint8), _BOR
    elif work is None:  # a reduce-scatter's input must survive, so the schedule runs on a copy of all of it
        work = backend.empty(job.count, job.source)
        backend.copy(work, job.source)
    execute(program, call.transport, backend, work, op)
    if collective == "reduce_scatter" and shares is not None:  # this rank's share
        lo = sum(shares[: group.rank])
        return work[lo : lo + shares[group.rank]]
    return work


def _allreduce(group: Communicator, call: Call, guard: PackedSignature, job: CheckedCall) -> None:
    """Run an allreduce through the node hierarchy or by its plan; keep a repeatable call's decisions."""
    op, backend, work, source = job.op, job.backend, job.work, job.source
    assert op is not None  # an allreduce reduces
    if _needs(group, call, call.algorithm, backend, "shared_memory_nodes"):
        _allreduce_nodes(group, call, backend, work, work if source is None else source, op)
        return
    early = job.early
    rank_plan = (
        early.plan
        if early is not None and early.plan is not None
        else allreduce_plan(group, call.algorithm, job.count, job.item_bytes, source is not None)
    )
    scratch = group.scratch.get(backend, rank_plan.scratch, work)
    arrived = None if early is None else early.arrived
    run_plan(rank_plan, call.transport, backend, work, op, scratch, source, arrived)
    # a call planned only after agreeing on the selector sent no data with its signature,
    # which later calls of its signature do: it is not one to repeat
    if _repeatable(job) and early is not None and job.repeat is not None:
        job.repeat.keep(
            RepeatedAllreduce(
                backend=backend, op=op, guard=guard, shape=job.shape, plan=rank_plan, scratch=scratch,
                sends=early.sends, outgoing=early.outgoing, arrived=arrived,
            )
        )  # fmt: skip


def _repeatable(job: CheckedCall) -> bool:
    """Whether a later call of ``job``'s key may run on its decisions: numpy arrays, decided before agreeing.

    A repeat does not copy its input into the result first, so neither may the call it repeats.
    """
    return job.early is not None and job.backend.name == "numpy" and not job.copied


def _allreduce_nodes(
    group: Communicator, call: Call, backend: ArrayBackend, work: Any, x: Any, op: ReduceOp
) -> None:
    """``work`` = the allreduce of ``x`` (may be ``work``): reduce-scatter in the node, rail, all-gather.

    See :mod:`collectives.algorithms.hierarchical_shared_memory`.
    """
    split = group.nodes
    if split is None:  # features said otherwise
        raise RuntimeError("no node split")
    nodes, node = split
    ranks = nodes.node_ranks
    local = ranks.index(group.rank)
    parts = even_split(x.shape[0], len(ranks))
    lo = sum(parts[:local])
    mine = work[lo : lo + parts[local]]

    def barrier(shared: SharedMemory, note: Sequence[int]) -> None:
        call.barrier(shared, note, ranks)

    # in place is safe: a rank writes only its own part, which only it reads
    node.reduce_scatter(backend, mine, x, parts, op, barrier)
    rail = len(nodes.rail_ranks)
    if rail > 1 and parts[local]:
        # every rank of the rail has the same part, so they choose alike
        item_bytes = itemsize(backend.dtype_name(work))
        algorithm = group.agreed_selector(call).choose("allreduce", rail, parts[local], item_bytes)
        program = rank_program("allreduce", algorithm, rail, parts[local], rank=nodes.rail.rank)
        execute(program, call.watch(nodes.rail, nodes.rail_ranks), backend, mine, op, group.scratch)
    node.allgather(backend, work, mine, parts, barrier)

