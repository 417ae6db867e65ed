"""The user's API: the collectives, the Communicator they run on, and explain."""

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

import math
import struct
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from .algorithms import ALGORITHMS, build_schedule
from .backends import ArrayBackend, adopt, backend_for
from .call import Call
from .chunking import even_split
from .errors import CalibrationError, CollectivesError, InvalidBufferError
from .execute import DEFAULT_SEGMENT_BYTES, Plan, Scratch, execute, opening, pack_opening, plan, run
from .execute_shared import (
    OVERSUBSCRIBED_SEGMENT_BYTES,
    SEGMENT_BYTES,
    Barrier,
    SharedExecutor,
    oversubscribed,
)
from .ops import ReduceOp, get_op
from .selector import (
    AUTO,
    CostModel,
    Explanation,
    Selector,
    check_algorithm,
    default_selector,
    itemsize,
    selector_for,
)
from .specs import check_root
from .transport.base import NodeSplit, SharedMemory, Transport
from .transport.device_path import DevicePath
from .transport.tags import Tag
from .watchdog import FUSED_BYTES, Guard, Watchdog

if TYPE_CHECKING:
    from mpi4py import MPI

    from .topology import Topology


class Communicator:
    """A group of ranks the collectives run over.

    Wraps an mpi4py intracommunicator (``MPI.COMM_WORLD`` when none is given)
    and keeps the library's traffic on a private duplicate of it, so creating
    one is collective over its ranks. A :class:`~collectives.transport.Transport`
    may be given instead, e.g. a loopback transport in tests. On the first
    ``algorithm="auto"`` call its ranks take rank 0's cost model, so that they
    all choose the same algorithm.

    Before each collective its ranks agree on the call (collective, count,
    dtype, op, root, algorithm, sequence number) and raise
    :class:`~collectives.MismatchError` on every rank if they differ; no
    collective waits longer than ``timeout`` (see :mod:`collectives.watchdog`).

    Args:
        comm: the mpi4py communicator, or a transport.
        timeout: seconds a collective may take before it raises
            :class:`~collectives.CollectiveTimeout`; ``$COLLECTIVES_TIMEOUT``
            or 30 minutes by default; 0 for no limit.
        stall_warning: seconds after which a waiting collective logs the ranks it
            waits for; ``$COLLECTIVES_STALL_WARNING`` or ``min(60, timeout / 2)``
            by default; 0 for none.
        check: whether calls are checked for mismatches unless a call says
            otherwise; ``$COLLECTIVES_CHECK`` (``1`` or ``0``) or on by default.
            It must be the same on every rank.
    """

    def __init__(
        self,
        comm: "MPI.Comm | Transport | None" = None,
        *,
        timeout: float | None = None,
        stall_warning: float | None = None,
        check: bool | None = None,
    ) -> None:
        self._selector: Selector | None = None  # agreed on the first algorithm="auto"
        self._scratch = Scratch()  # reused by every call, so repeated calls allocate nothing
        self._shared: SharedExecutor | None = None
        self._nodes: NodeSplit | None = None  # where the ranks span several nodes
        self._node_shared: SharedExecutor | None = None  # over this rank's node then
        self._features: frozenset[str] | None = None  # what the transport offers, asked once
        self._device_paths: dict[str, DevicePath] = {}  # by backend: made on the first device call
        self._prepared: dict[tuple[Any, ...], _Prepared] = {}  # repeated calls' checked decisions
        if isinstance(comm, Transport):
            self._transport = comm
        else:
            from .transport.mpi import MPITransport

            self._transport = MPITransport(comm)
        self._watchdog = Watchdog(self._transport, timeout=timeout, stall_warning=stall_warning, check=check)

    @property
    def rank(self) -> int:
        """This process's rank."""
        return self._transport.rank

    @property
    def size(self) -> int:
        """The world size."""
        return self._transport.size

    @property
    def transport(self) -> Transport:
        """The transport the collectives send over."""
        return self._transport

    @property
    def features(self) -> frozenset[str]:
        """What the transport offers beyond messages.

        ``"shared_memory"`` when all ranks share a node; ``"shared_memory_nodes"``
        (and ``"ranks_per_node=G"``) when they span several nodes of G ranks each
        (``$COLLECTIVES_RANKS_PER_NODE`` splits one machine into pretend nodes);
        ``"oversubscribed"`` besides when a node's ranks outnumber its cores.

        Collective the first time it is asked (the ranks agree on a shared window);
        from then on, where all ranks share a node, they agree on each call's
        signature through a barrier of that memory instead of messages.
        """
        if self._features is None:
            shared = self._transport.shared_memory()
            nodes = None if shared is not None else self._transport.node_split()
            node_ranks = self.size if shared is not None else len(nodes.node_ranks) if nodes else 1
            crowded = oversubscribed(node_ranks)  # then barriers are dear: fewer, longer segments
            segment = OVERSUBSCRIBED_SEGMENT_BYTES if crowded else SEGMENT_BYTES
            extra = ("oversubscribed",) if crowded else ()
            if shared is not None:
                self._shared = SharedExecutor(shared, self.rank, self.size, segment)
                # from the next call on, the ranks agree on signatures through a barrier, not messages,
                # so no data travels with them: forget the calls prepared to send it so
                self._watchdog.agree_through(shared, self._shared.reset)
                self._prepared.clear()
                self._features = frozenset({"shared_memory", *extra})
            elif nodes is not None:
                self._nodes = nodes
                self._node_shared = SharedExecutor(
                    nodes.shared, nodes.node_ranks.index(self.rank), len(nodes.node_ranks), segment
                )
                node = f"ranks_per_node={len(nodes.node_ranks)}"
                self._features = frozenset({"shared_memory_nodes", node, *extra})
            else:
                self._features = frozenset()
        return self._features

    @property
    def device_path(self) -> str | None:
        """How device arrays travel: ``"cuda ipc"``, ``"cuda-aware mpi"`` or ``"host staging"``.

        ``None`` until the first collective on device arrays chooses it (collectively;
        see :func:`collectives.transport.device_path.connect`).
        """
        path = next(iter(self._device_paths.values()), None)
        return None if path is None else path.name

    def _device_path(self, backend: ArrayBackend) -> DevicePath | None:
        """The path of ``backend``'s device arrays, made on first use; ``None`` for host arrays."""
        path = self._device_paths.get(backend.name)
        if path is None:
            device = backend.device()
            if device is None:
                return None
            from .transport.device_path import connect

            path = self._device_paths[backend.name] = connect(self._transport, device)
        return path

    @property
    def timeout(self) -> float:
        """Seconds a collective may take; ``math.inf`` for no limit."""
        return self._watchdog.timeout

    def alloc(self, shape: "int | Sequence[int]", dtype: Any = "float32") -> Any:
        """A numpy array in memory every rank of the node maps, for collectives that need no copy.

        An allreduce in place (``out=x``) or a reduce_scatter of such an array, with
        the ``shared_memory`` algorithm (or ``"auto"`` choosing it), reads the
        other ranks' data where it already lies instead of copying it through a
        window first. Every rank must pass such an array or none may (a
        :class:`~collectives.MismatchError` says so otherwise).

        Collective: every rank of the communicator calls it, in the same order
        (each gets its own array; shapes may differ). The memory lives until
        :meth:`free`, so the array must not be used after it. Where the transport
        has no shared memory (a loopback transport, ranks on several nodes) it is
        a plain ``numpy.empty`` array, and the collectives copy as usual.

        Args:
            shape: the array's shape.
            dtype: a numpy dtype or its name.

        Returns:
            An uninitialised C-contiguous numpy array.
        """
        import numpy as np

        dims = (shape,) if isinstance(shape, int) else tuple(shape)
        kind = np.dtype(dtype)
        if any(not isinstance(d, int | np.integer) or d < 0 for d in dims):
            raise InvalidBufferError(f"alloc needs a shape of non-negative integers, got {shape!r}")
        nbytes = math.prod(dims) * kind.itemsize
        if "shared_memory" not in self.features or self._shared is None:
            return np.empty(dims, kind)
        # padded, so every allocation starts on a cache line and a zero-size one still exists
        memory = self._shared.alloc(max(-(-nbytes // 64) * 64, 64))
        return np.frombuffer(memory, np.uint8, nbytes).view(kind).reshape(dims)

    def flight_record(self) -> list[str]:
        """This rank's last collectives on the communicator, oldest first, one line each."""
        return self._watchdog.flight_record()

    def free(self) -> None:
        """Release the library's duplicate communicator; collective, like creating it."""
        self._scratch.clear()
        for path in self._device_paths.values():
            path.close()
        self._device_paths.clear()
        self._prepared.clear()
        self._transport.close()

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, transport={type(self._transport).__name__})"


_default: Communicator | None = None
_wrapped: list[tuple["weakref.ref[Any]", Communicator]] = []


def _communicator(comm: "Communicator | MPI.Comm | None") -> Communicator:
    global _default
    if isinstance(comm, Communicator):
        return comm
    if comm is None:
        if _default is None:
            _default = Communicator()
        return _default
    # an mpi4py communicator: duplicate it once and reuse that (mpi4py comms are not hashable)
    for ref, wrapper in _wrapped:
        if ref() is comm:
            return wrapper
    wrapper = Communicator(comm)
    _wrapped[:] = [(r, w) for r, w in _wrapped if r() is not None]
    _wrapped.append((weakref.ref(comm), wrapper))
    return wrapper


def _prepare(
    x: Any, op: "str | ReduceOp | None", collective: str, algorithm: str
) -> tuple[ArrayBackend, ReduceOp | None, int]:
    """The backend of ``x``, the checked op, and the bytes per element; raises on a bad algorithm name."""
    backend = backend_for(x)
    dtype = backend.dtype_name(x)
    check_algorithm(collective, algorithm)
    if op is None:
        return backend, None, itemsize(dtype)
    reduce_op = get_op(op)
    reduce_op.check_dtype(dtype)
    return backend, reduce_op, itemsize(dtype)


_MODEL_FORMAT = struct.Struct("5d")  # the cost model rank 0 sends: alpha, beta, gamma, barrier, copy


def _agreed_selector(group: Communicator) -> Selector:
    """Rank 0's selector, on every rank of ``group``; collective on the first call.

    Rank 0 loads the calibration for ``group.size`` ranks. Ranks whose
    calibrations differ would choose different algorithms and wait on each other
    forever, so they all take rank 0's constants.
    """
    if group._selector is not None:
        return group._selector
    transport = group.transport
    message = bytearray(_MODEL_FORMAT.size)
    if transport.size == 1:
        selector = default_selector(group.size)
    elif transport.rank == 0:
        try:
            selector = default_selector(group.size)
        except CalibrationError:
            # tell the others, or they would wait for constants that never come
            _MODEL_FORMAT.pack_into(message, 0, *(math.nan,) * 5)
            transport.waitall([transport.isend(message, peer, Tag.SELECTOR) for peer in range(1, group.size)])
            raise
        model = selector.model
        _MODEL_FORMAT.pack_into(message, 0, model.alpha, model.beta, model.gamma, model.barrier, model.copy)
        transport.waitall([transport.isend(message, peer, Tag.SELECTOR) for peer in range(1, group.size)])
    else:
        transport.waitall([transport.irecv(message, 0, Tag.SELECTOR)])
        alpha, beta, gamma, barrier, copy = _MODEL_FORMAT.unpack(message)
        if math.isnan(alpha):
            raise CalibrationError("rank 0 could not load its calibration; see its error")
        selector = selector_for(CostModel(alpha, beta, gamma, barrier, copy, source="calibration of rank 0"))
    group._selector = selector
    return selector


def _algorithm(
    group: Communicator, collective: str, algorithm: str, count: int, item_bytes: int, device: bool = False
) -> str:
    """``algorithm``, or the selector's choice for ``"auto"``.

    Device arrays never use the host's shared memory, so the selector is not offered it for them.
    """
    if algorithm != AUTO:
        return algorithm
    features = frozenset() if device else group.features
    return _agreed_selector(group).choose(collective, group.size, count, item_bytes, features)


def _on_device(group: Communicator, call: Call, backend: ArrayBackend) -> bool:
    """Send the call's messages over the communicator's device path if ``backend`` has a device."""
    path = group._device_path(backend)
    if path is None:
        return False
    call.run_on(path.transport)
    return True


def _route(
    group: Communicator,
    call: Call,
    backend: ArrayBackend,
    collective: str,
    algorithm: str,
    count: int,
    item_bytes: int,
) -> None:
    """Send the call's messages over the device path for device arrays, and choose its algorithm."""
    device = _on_device(group, call, backend)
    call.algorithm = _algorithm(group, collective, algorithm, count, item_bytes, device)


def _shared(group: Communicator, algorithm: str, backend: ArrayBackend) -> SharedExecutor | None:
    """The shared-memory executor, when ``algorithm`` declares it needs shared memory and it can run it."""
    needs = getattr(ALGORITHMS[algorithm], "REQUIRES", None)
    if needs != "shared_memory" or backend.name != "numpy" or needs not in group.features:
        return None
    return group._shared


def _across_nodes(group: Communicator, algorithm: str, backend: ArrayBackend) -> bool:
    """Whether ``algorithm`` runs through nodes' shared memory and rails here."""
    needs = getattr(ALGORITHMS[algorithm], "REQUIRES", None)
    return needs == "shared_memory_nodes" and backend.name == "numpy" and needs in group.features


def _allreduce_nodes(
    group: Communicator, call: Call, backend: ArrayBackend, work: Any, x: Any, op: ReduceOp
) -> None:
    """``work`` = the allreduce of ``x`` (may be ``work``): reduce-scatter in the node, rail, all-gather.

    See :mod:`collectives.algorithms.hierarchical_shared_memory`.
    """
    nodes, node = group._nodes, group._node_shared
    if nodes is None or node is None:  # features said otherwise
        raise RuntimeError("no node split")
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
        algorithm = _agreed_selector(group).choose("allreduce", rail, parts[local], item_bytes)
        schedule = build_schedule("allreduce", algorithm, rail, parts[local])
        execute(schedule, call.watch(nodes.rail, nodes.rail_ranks), backend, mine, op, group._scratch)
    node.allgather(backend, work, mine, parts, barrier)


def _watch(
    group: Communicator,
    collective: str,
    algorithm: str,
    count: int,
    dtype: str = "",
    op: ReduceOp | None = None,
    root: int = -1,
    counts: Sequence[int] | None = None,
    check: bool | None = None,
    backend: str = "",
) -> AbstractContextManager[Call]:
    """The guard of one call: signature agreement, deadlines, flight recorder (see collectives.watchdog)."""
    guard = _guard(group, collective, algorithm, count, dtype, op, root, counts, backend)
    return group._watchdog.watch(guard, check)


def _guard(
    group: Communicator,
    collective: str,
    algorithm: str,
    count: int,
    dtype: str = "",
    op: ReduceOp | None = None,
    root: int = -1,
    counts: Sequence[int] | None = None,
    backend: str = "",
) -> Guard:
    """The packed signature of one call, as :func:`_watch` checks it."""
    shares = None if counts is None else tuple(int(c) for c in counts)
    name = "" if op is None else op.name
    return group._watchdog.guard(collective, algorithm, count, dtype, name, root, shares, backend=backend)


def _refuse(
    group: Communicator, collective: str, algorithm: object, check: bool | None, error: Exception
) -> None:
    """Tell the other ranks that this rank's checks of a call failed, so that they raise too.

    Every error raised while a call is prepared, before its signature goes, is
    told: the library's own (a bad buffer, dtype, op, root, algorithm ...) and any
    other (a foreign array's protocol failing, memory for the workspace), since
    the other ranks would otherwise wait for the timeout. Not with checking off.
    """
    group._watchdog.poison(collective, algorithm, error, check)


def _check_out(backend: ArrayBackend, out: Any, x: Any, shape: tuple[int, ...]) -> None:
    if not backend.owns(out):
        raise InvalidBufferError(f"out is a {type(out).__name__}, but the input is a {type(x).__name__}")
    if out.dtype != x.dtype:
        raise InvalidBufferError(f"out has dtype {out.dtype}, expected {x.dtype}")
    if tuple(out.shape) != shape:
        raise InvalidBufferError(f"out has shape {tuple(out.shape)}, expected {shape}")
    if not backend.writable(out):
        raise InvalidBufferError("out is read-only")


def _workspace(backend: ArrayBackend, out: Any, count: int, like: Any) -> tuple[Any, bool]:
    """A contiguous 1-D buffer for the result: ``out`` itself when it can be, and whether it is."""
    if out is not None:
        view = backend.flat_view(out)
        if view is not None:
            return view, True
    return backend.empty(count, like), False


_PREPARED_KEPT = 256  # distinct repeated calls remembered per communicator


class _Prepared:
    """What a call decided once it had checked its arguments, reused by every later call of its key.

    A key names everything the decisions depend on (see :func:`_allreduce_key`), so
    a call that finds its key skips validation, the selector, the schedule and
    plan caches and the packing of its signature; it still numbers, checks, bounds
    and records the call like any other.
    """

    __slots__ = (
        "arrived",
        "averages",
        "backend",
        "guard",
        "op",
        "outgoing",
        "plan",
        "scratch",
        "sends",
        "shape",
        "shared",
        "shares",
    )

    def __init__(
        self,
        backend: ArrayBackend,
        op: ReduceOp | None,
        guard: Guard,
        rank_plan: Plan | None,
        scratch: Any,
        shape: tuple[int, ...],
        sends: tuple[Any, ...],
        outgoing: dict[int, Any],
        arrived: dict[int, Any] | None,
        shared: SharedExecutor | None = None,
        shares: tuple[int, ...] = (),
    ) -> None:
        self.backend = backend
        self.op = op
        self.guard = guard
        self.plan = rank_plan  # None: the shared-memory executor runs the call
        self.shared = shared
        self.scratch = scratch
        self.shape = shape
        self.averages = op is not None and op.averages
        self.sends = sends  # the opening sends, packed into outgoing before the signature goes
        self.outgoing = outgoing
        self.arrived = arrived  # the opening receives, by peer, once the signature has come
        self.shares = shares  # of a reduce-scatter or all-gather: every rank's elements


def _plan(group: "Communicator", algorithm: str, count: int, item_bytes: int, separate: bool) -> Plan:
    """This rank's plan of an allreduce by ``algorithm`` (a name, not ``"auto"``)."""
    schedule = build_schedule("allreduce", algorithm, group.size, count)
    return plan(schedule, group.rank, max(DEFAULT_SEGMENT_BYTES // item_bytes, 1), separate)


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
    if algorithm == AUTO:
        # asking for the features may be collective, which must wait until the call is checked too
        if group._selector is None or group._features is None:
            return None
        algorithm = group._selector.choose("allreduce", group.size, count, item_bytes, group.features)
    needs = getattr(ALGORITHMS[algorithm], "REQUIRES", None)
    if needs is not None:
        # features are set up collectively by the first call that needs them, never before agreeing
        known = group._features is not None and needs in group._features and group._shared is not None
        return (algorithm, None) if known and needs == "shared_memory" and backend.name == "numpy" else None
    try:
        return algorithm, _plan(group, algorithm, count, item_bytes, separate)
    except (CollectivesError, ValueError):
        return None  # raised again once the call has been checked


def _fuses(group: "Communicator", check: bool | None, nbytes: int, backend: ArrayBackend) -> bool:
    """Whether a call's first messages travel with its signature, saving a round trip.

    Only when there is a signature to travel with, and the data is small: a
    receiver keeps room for that much from every peer. The same on every rank of a
    matching call, as its ranks agree on the check and on the count and dtype.
    """
    watchdog = group._watchdog
    checking = watchdog.check if check is None else check
    by_messages = watchdog.shared is None  # else the signature goes through shared memory, without data
    return checking and by_messages and group.size > 1 and nbytes <= FUSED_BYTES and backend.name == "numpy"


def _allreduce_key(x: Any, op: Any, out: Any, algorithm: str, check: bool | None) -> tuple[Any, ...] | None:
    """The key of an allreduce's decisions; ``None`` for arguments no decision is kept for."""
    if not isinstance(op, str | ReduceOp):
        return None
    result = "new" if out is None else "in place" if out is x else "out"
    try:
        return (type(x), x.shape, x.dtype, op, algorithm, result, check)
    except AttributeError:
        return None


def _fits(prepared: _Prepared, x: Any, out: Any) -> bool:
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


def _separate_out(prepared: _Prepared, x: Any, out: Any) -> bool:
    """Whether ``out`` is writable, C-contiguous, of x's type, dtype and prepared shape, and apart from x."""
    return (
        type(out) is type(x)
        and out.shape == prepared.shape
        and out.dtype == x.dtype
        and out.flags.c_contiguous
        and out.flags.writeable
        and not prepared.backend.shares_memory(out, x)
    )


def _remember(group: "Communicator", key: tuple[Any, ...], prepared: _Prepared) -> None:
    if len(group._prepared) >= _PREPARED_KEPT:
        group._prepared.clear()  # start afresh rather than evict one by one
    group._prepared[key] = prepared


def _allreduce_prepared(
    group: "Communicator", prepared: _Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """allreduce by decisions an earlier call of the same key made and checked."""
    backend, op = prepared.backend, prepared.op
    assert op is not None  # the records of calls that reduce have their op
    if out is x:
        work, source = (x if x.ndim == 1 else x.reshape(-1)), None
    else:
        work = backend.empty(x.size, x) if out is None else out.reshape(-1)
        source = x.reshape(-1)
    watchdog = group._watchdog
    if prepared.arrived is not None:
        pack_opening(prepared.sends, backend, work, source, prepared.outgoing)
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
        watchdog.end(call, error)
        raise
    watchdog.end(call)
    if prepared.averages:
        backend.divide(work, group.size)
    return work.reshape(prepared.shape) if out is None else out


def allreduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Combine ``x`` element-wise across all ranks; every rank gets the result.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        op: ``sum``, ``prod``, ``min``, ``max``, ``avg`` (floating types) or
            ``band``, ``bor``, ``bxor`` (integers).
        out: where to put the result, of ``x``'s shape and dtype; ``out=x``
            reduces in place.
        algorithm: the algorithm's name, e.g. ``"ring"``; ``"auto"`` (the default)
            runs the one the cost model predicts fastest (see :func:`explain`).
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        The result, ``out`` when given.
    """
    key = _allreduce_key(x, op, out, algorithm, check)
    known = comm if isinstance(comm, Communicator) else _default if comm is None else None
    if key is not None and known is not None:
        prepared = known._prepared.get(key)
        if prepared is not None and _fits(prepared, x, out):
            return _allreduce_prepared(known, prepared, x, out, check)
    group = known or _communicator(comm)
    watchdog = group._watchdog
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, checked_op, item_bytes = _prepare(x, op, "allreduce", algorithm)
        reduce_op = get_op(op) if checked_op is None else checked_op  # get_op names a missing op
        shape = tuple(x.shape)
        if out is not None:
            _check_out(backend, out, x, shape)
        work, in_out = _workspace(backend, out, x.size, x)
        source = None
        if not (in_out and out is x):
            # the schedule reads x where it first needs each chunk, sparing a copy into work
            source = backend.flat_view(x)
            if source is None or backend.shares_memory(source, work):
                backend.copy(work, x)
                source = None
        on_host = backend.device() is None
        early = None
        if on_host:
            early = _plan_early(group, algorithm, x.size, item_bytes, source is not None, backend)
        early_plan = None if early is None else early[1]
        fused = early_plan is not None and _fuses(group, check, x.size * item_bytes, backend)
        sends, recvs = opening(early_plan) if early_plan is not None and fused else ((), ())
        payloads = {m.peer: (m.hi - m.lo) * item_bytes for m in sends}
        dtype = backend.dtype_name(x)
        guard = watchdog.guard(
            "allreduce", algorithm, x.size, dtype, reduce_op.name, backend=backend.name, payloads=payloads
        )
        outgoing = {peer: backend.from_bytes(view, work) for peer, view in guard.outgoing.items()}
        arrived = None
        if sends or recvs:
            pack_opening(sends, backend, work, source, outgoing)
            arrived = {
                m.peer: backend.from_bytes(watchdog.arrived(m.peer, (m.hi - m.lo) * item_bytes), work)
                for m in recvs
            }
    except Exception as error:
        _refuse(group, "allreduce", algorithm, check, error)
        raise
    call = watchdog.watch(guard, check, first_barrier=early is not None and early_plan is None)
    try:
        device = not on_host and _on_device(group, call, backend)
        if early is None:
            call.algorithm = _algorithm(group, "allreduce", algorithm, x.size, item_bytes, device)
            shared = _shared(group, call.algorithm, backend)
        else:
            call.algorithm, shared = early[0], group._shared if early_plan is None else None
        # calls decided before agreeing are the ones to repeat; a repeat must not copy x first
        repeatable = early is not None and backend.name == "numpy"
        repeatable = repeatable and ((in_out and out is x) or source is not None)
        if shared is not None:
            shared.allreduce(backend, work, work if source is None else source, reduce_op, call.barrier)
            if key is not None and repeatable:
                prepared = _Prepared(backend, reduce_op, guard, None, None, shape, (), {}, None, shared)
                _remember(group, key, prepared)
        elif _across_nodes(group, call.algorithm, backend):
            _allreduce_nodes(group, call, backend, work, work if source is None else source, reduce_op)
        else:
            rank_plan = (
                early_plan
                if early_plan is not None
                else _plan(group, call.algorithm, x.size, item_bytes, source is not None)
            )
            scratch = group._scratch.get(backend, rank_plan.scratch, work)
            run(rank_plan, call.transport, backend, work, reduce_op, scratch, source, arrived)
            # a call planned only after agreeing on the selector sent no data with its signature,
            # which later calls of its signature do: it is not one to repeat
            if key is not None and repeatable:
                prepared = _Prepared(
                    backend, reduce_op, guard, rank_plan, scratch, shape, sends, outgoing, arrived
                )
                _remember(group, key, prepared)
    except BaseException as error:
        watchdog.end(call, error)
        raise
    watchdog.end(call)
    if reduce_op.averages:
        backend.divide(work, group.size)
    return _deliver(backend, work, in_out, out, shape)


def _shares_key(
    collective: str, x: Any, op: Any, counts: Any, out: Any, algorithm: str, check: bool | None
) -> tuple[Any, ...] | None:
    """The key of a reduce-scatter's or all-gather's decisions; ``None`` for arguments none is kept for."""
    if op is not None and not isinstance(op, str | ReduceOp):
        return None
    try:
        shares = None if counts is None else tuple(counts)
        return (collective, type(x), x.shape, x.dtype, op, shares, algorithm, out is None, check)
    except (AttributeError, TypeError):
        return None  # not an array, or counts not a sequence: the full path names the problem


def _fits_shares(prepared: _Prepared, x: Any, out: Any) -> bool:
    """Whether the arrays of a reduce-scatter or all-gather whose key matched pass its first call's checks."""
    return bool(x.flags.c_contiguous) and (out is None or _separate_out(prepared, x, out))


def _on_shared_memory(
    group: "Communicator", prepared: _Prepared, check: bool | None, run: Callable[[Barrier], None]
) -> None:
    """Run a prepared call on the shared-memory executor: ``run(barrier)``, its first barrier checking it."""
    watchdog = group._watchdog
    call = watchdog.watch(prepared.guard, check, first_barrier=True)
    try:
        run(call.barrier)
    except BaseException as error:
        watchdog.end(call, error)
        raise
    watchdog.end(call)


def _reduce_scatter_prepared(
    group: "Communicator", prepared: _Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """reduce_scatter by decisions an earlier call of the same key made and checked."""
    backend, shared, op = prepared.backend, prepared.shared, prepared.op
    assert shared is not None and op is not None  # only reductions run on shared memory are prepared
    if out is None:
        out = backend.empty(prepared.shares[group.rank], x).reshape(prepared.shape)
    target = out.reshape(-1)
    _on_shared_memory(
        group,
        prepared,
        check,
        lambda barrier: shared.reduce_scatter(backend, target, x.reshape(-1), prepared.shares, op, barrier),
    )
    if prepared.averages:
        backend.divide(target, group.size)
    return out


def _allgather_prepared(
    group: "Communicator", prepared: _Prepared, x: Any, out: Any, check: bool | None
) -> Any:
    """allgather by decisions an earlier call of the same key made and checked."""
    backend, shared, shares = prepared.backend, prepared.shared, prepared.shares
    assert shared is not None  # only calls run on the shared-memory executor are prepared
    work = backend.empty(sum(shares), x) if out is None else out.reshape(-1)
    # the executor copies this rank's part into work as it copies the others'
    _on_shared_memory(
        group,
        prepared,
        check,
        lambda barrier: shared.allgather(backend, work, x.reshape(-1), shares, barrier),
    )
    return work.reshape(prepared.shape) if out is None else out


def reduce_scatter(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
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
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        This rank's share of the result, ``out`` when given.
    """
    key = _shares_key("reduce_scatter", x, op, counts, out, algorithm, check)
    known = comm if isinstance(comm, Communicator) else _default if comm is None else None
    if key is not None and known is not None:
        prepared = known._prepared.get(key)
        if prepared is not None and _fits_shares(prepared, x, out):
            return _reduce_scatter_prepared(known, prepared, x, out, check)
    group = known or _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, reduce_op, item_bytes = _prepare(x, op, "reduce_scatter", algorithm)
        size, rank = group.size, group.rank
        shares, share_shape, _ = _shares("reduce_scatter", x, counts, size, rank, x.size)
        if out is not None:
            _check_out(backend, out, x, share_shape)
        dtype = backend.dtype_name(x)
    except Exception as error:
        _refuse(group, "reduce_scatter", algorithm, check, error)
        raise
    guard = _guard(group, "reduce_scatter", algorithm, x.size, dtype, reduce_op, -1, counts, backend.name)
    with group._watchdog.watch(guard, check) as call:
        _route(group, call, backend, "reduce_scatter", algorithm, x.size, item_bytes)
        shared = _shared(group, call.algorithm, backend)
        flat = backend.flat_view(x)
        if shared is not None and reduce_op is not None and flat is not None:
            if out is None:
                out = backend.empty(shares[rank], x).reshape(share_shape)
            mine = backend.flat_view(out)
            target = (
                backend.empty(shares[rank], x) if mine is None or backend.shares_memory(mine, flat) else mine
            )
            shared.reduce_scatter(backend, target, flat, shares, reduce_op, call.barrier)
            if key is not None and target is mine and backend.name == "numpy":
                _remember(group, key, _Prepared(backend, reduce_op, guard, None, None, share_shape,
                                                (), {}, None, shared, shares))  # fmt: skip
            if reduce_op.averages:
                backend.divide(target, size)
            if target is not mine:
                backend.copy(out, target)
            return out
        # the input must survive, so the schedule runs on a copy of all of it
        work = backend.empty(x.size, x)
        backend.copy(work, x)
        schedule = build_schedule("reduce_scatter", call.algorithm, size, x.size, shares)
        execute(schedule, call.transport, backend, work, reduce_op)
    lo = sum(shares[:rank])
    mine = work[lo : lo + shares[rank]]
    if reduce_op is not None and reduce_op.averages:
        backend.divide(mine, size)
    if out is None:
        out = backend.empty(shares[rank], x).reshape(share_shape)
    backend.copy(out, mine)
    return out


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
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        The concatenation, ``out`` when given.
    """
    key = _shares_key("allgather", x, None, counts, out, algorithm, check)
    known = comm if isinstance(comm, Communicator) else _default if comm is None else None
    if key is not None and known is not None:
        prepared = known._prepared.get(key)
        if prepared is not None and _fits_shares(prepared, x, out):
            return _allgather_prepared(known, prepared, x, out, check)
    group = known or _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, _, item_bytes = _prepare(x, None, "allgather", algorithm)
        size, rank = group.size, group.rank
        total = x.size * size if counts is None else sum(counts)
        shares, _, whole_shape = _shares("allgather", x, counts, size, rank, total)
        if counts is not None and x.size != shares[rank]:
            raise InvalidBufferError(f"x has {x.size} elements but counts[{rank}] is {shares[rank]}")
        if out is not None:
            _check_out(backend, out, x, whole_shape)
        work, in_out = _workspace(backend, out, total, x)
        lo = sum(shares[:rank])
        backend.copy(work[lo : lo + shares[rank]], x)
    except Exception as error:
        _refuse(group, "allgather", algorithm, check, error)
        raise
    dtype = backend.dtype_name(x)
    guard = _guard(group, "allgather", algorithm, total, dtype, None, -1, counts, backend.name)
    with group._watchdog.watch(guard, check) as call:
        _route(group, call, backend, "allgather", algorithm, total, item_bytes)
        shared = _shared(group, call.algorithm, backend)
        if shared is not None:
            shared.allgather(backend, work, work[lo : lo + shares[rank]], shares, call.barrier)
            if key is not None and backend.name == "numpy":
                _remember(group, key, _Prepared(backend, None, guard, None, None, whole_shape,
                                                (), {}, None, shared, shares))  # fmt: skip
        else:
            schedule = build_schedule("allgather", call.algorithm, size, total, shares)
            execute(schedule, call.transport, backend, work)
    return _deliver(backend, work, in_out, out, whole_shape)


def explain(
    collective: str,
    count: int,
    dtype: object = "float32",
    *,
    world_size: int | None = None,
    comm: "Communicator | MPI.Comm | None" = None,
    op: "str | ReduceOp" = "sum",
    topology: "Topology | None" = None,
    device: bool = False,
) -> Explanation:
    """What ``algorithm="auto"`` runs for ``collective`` of ``count`` elements, and why.

    Nothing is sent: the explanation is this rank's, with the cost model the
    communicator agreed on if it already has (rank 0's), else this process's
    calibration for ``world_size`` ranks. ``print()`` it for a table of every
    algorithm's predicted time. For device arrays, and wherever the communicator
    already has a device path, it also says how device buffers travel (CUDA IPC,
    CUDA-aware MPI or host staging, and why).

    Args:
        collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
        count: elements of the full buffer (allreduce's buffer, reduce_scatter's
            input, allgather's output).
        dtype: the element type, by name (``"float32"``) or as a dtype.
        world_size: the number of ranks; the communicator's size by default.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        op: the reduction, for the collectives that reduce.
        topology: predict on this machine's links instead (one GPU per rank), as
            :meth:`collectives.selector.Selector.explain` says; the choice is then advice
            for that machine, and what this communicator's ``"auto"`` runs is unchanged.
        device: explain a call on device arrays: they never use the host's shared
            memory, and the explanation names their path (the communicator's once its
            first device call chose it, else as far as is known without asking the ranks).

    Returns:
        Each candidate's prediction, the rejected algorithms with their reasons, and the choice.
    """
    selector = None
    group = None
    if world_size is None or comm is not None:
        group = _communicator(comm)
        world_size = group.size if world_size is None else world_size
        selector = group._selector
        features = group._features or frozenset()  # as agreed by earlier calls; asking would be collective
    else:
        features = frozenset()
    features = frozenset() if device else features  # device arrays never use the host's shared memory
    explanation = (selector or default_selector(world_size)).explain(
        collective, count, dtype, world_size=world_size, op=op, features=features, topology=topology
    )
    path = None if group is None else next(iter(group._device_paths.values()), None)
    if path is None and not device:
        return explanation
    from dataclasses import replace

    from .transport.device_path import foresee

    route = path.describe() if path is not None else foresee(None if group is None else group.transport)
    return replace(explanation, device=route)


def _shares(
    collective: str, x: Any, counts: Sequence[int] | None, size: int, rank: int, total: int
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Each rank's share of the buffer, the shape of this rank's share, and the shape of the whole."""
    if counts is not None:
        shares = tuple(int(c) for c in counts)
        if len(shares) != size or any(c < 0 for c in shares):
            raise InvalidBufferError(
                f"counts must give {size} non-negative element counts, one per rank; got {tuple(counts)}"
            )
        if sum(shares) != total:
            raise InvalidBufferError(f"counts {shares} add up to {sum(shares)}, not {total}")
        return shares, (shares[rank],), (total,)
    rows = x.shape[0] if x.ndim else 1
    rest = tuple(x.shape[1:])
    if collective in ("allgather", "gather"):
        return (x.size,) * size, tuple(x.shape), (rows * size, *rest)
    _check_rows(collective, x, size, "; pass counts= for unequal shares")
    return (x.size // size,) * size, (rows // size, *rest), tuple(x.shape)


def _check_rows(collective: str, x: Any, size: int, hint: str = "") -> None:
    """Raise unless ``x`` has a first dimension divisible by the world size."""
    if x.ndim == 0 or x.shape[0] % size:
        raise InvalidBufferError(
            f"{collective} needs the first dimension of x (shape {tuple(x.shape)}) to be "
            f"divisible by the world size {size}{hint}"
        )


def _deliver(backend: ArrayBackend, work: Any, in_out: bool, out: Any, shape: tuple[int, ...]) -> Any:
    if in_out:
        return out
    if out is None:
        return work.reshape(shape)
    backend.copy(out, work)
    return out


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
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        The root's data, ``out`` when given.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    group = _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, _, item_bytes = _prepare(x, None, "broadcast", algorithm)
        root = check_root(root, group.size)
        shape = tuple(x.shape)
        if out is not None:
            _check_out(backend, out, x, shape)
        work, in_out = _workspace(backend, out, x.size, x)
        if group.rank == root and not (in_out and out is x):
            backend.copy(work, x)
    except Exception as error:
        _refuse(group, "broadcast", algorithm, check, error)
        raise
    dtype = backend.dtype_name(x)
    with _watch(group, "broadcast", algorithm, x.size, dtype, None, root, None, check, backend.name) as call:
        _route(group, call, backend, "broadcast", algorithm, x.size, item_bytes)
        schedule = build_schedule("broadcast", call.algorithm, group.size, x.size, root=root)
        execute(schedule, call.transport, backend, work)
    return _deliver(backend, work, in_out, out, shape)


def reduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Any:
    """Combine ``x`` element-wise across all ranks; the root gets the result.

    Args:
        x: this rank's array; the same shape and dtype on every rank.
        op: the reduction, as for :func:`allreduce`.
        root: the rank that gets the result.
        out: where the root puts the result, of ``x``'s shape and dtype;
            ``out=x`` reduces in place. Checked on every rank, written only
            at the root.
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        At the root, the result (``out`` when given); ``None`` elsewhere, as
        mpi4py's ``comm.reduce``.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    group = _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, reduce_op, item_bytes = _prepare(x, op, "reduce", algorithm)
        root = check_root(root, group.size)
        shape = tuple(x.shape)
        if out is not None:
            _check_out(backend, out, x, shape)
        at_root = group.rank == root
        # elsewhere an algorithm may combine partial results in the buffer, so it is a copy of x too
        work, in_out = _workspace(backend, out if at_root else None, x.size, x)
        if not (in_out and out is x):
            backend.copy(work, x)
        dtype = backend.dtype_name(x)
    except Exception as error:
        _refuse(group, "reduce", algorithm, check, error)
        raise
    with _watch(
        group, "reduce", algorithm, x.size, dtype, reduce_op, root, None, check, backend.name
    ) as call:
        _route(group, call, backend, "reduce", algorithm, x.size, item_bytes)
        schedule = build_schedule("reduce", call.algorithm, group.size, x.size, root=root)
        execute(schedule, call.transport, backend, work, reduce_op)
    if not at_root:
        return None
    if reduce_op is not None and reduce_op.averages:
        backend.divide(work, group.size)
    return _deliver(backend, work, in_out, out, shape)


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
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        At the root, the concatenation (``out`` when given); ``None`` elsewhere.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
    """
    group = _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, _, item_bytes = _prepare(x, None, "gather", algorithm)
        size, rank = group.size, group.rank
        root = check_root(root, size)
        total = x.size * size if counts is None else sum(counts)
        shares, _, whole_shape = _shares("gather", x, counts, size, rank, total)
        if counts is not None and x.size != shares[rank]:
            raise InvalidBufferError(f"x has {x.size} elements but counts[{rank}] is {shares[rank]}")
        if out is not None:
            _check_out(backend, out, x, whole_shape)
        at_root = rank == root
        work, in_out = _workspace(backend, out if at_root else None, total, x)
        lo = sum(shares[:rank])
        backend.copy(work[lo : lo + shares[rank]], x)
    except Exception as error:
        _refuse(group, "gather", algorithm, check, error)
        raise
    dtype = backend.dtype_name(x)
    with _watch(group, "gather", algorithm, total, dtype, None, root, counts, check, backend.name) as call:
        _route(group, call, backend, "gather", algorithm, total, item_bytes)
        schedule = build_schedule("gather", call.algorithm, size, total, shares, root=root)
        execute(schedule, call.transport, backend, work)
    return _deliver(backend, work, in_out, out, whole_shape) if at_root else None


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
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        This rank's share, ``out`` when given.

    Raises:
        InvalidRootError: ``root`` is not a rank of the communicator.
        InvalidBufferError: the root has no ``x``, or another rank has
            neither ``x`` nor ``out``.
    """
    group = _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)
        size, rank = group.size, group.rank
        root = check_root(root, size)
        if x is None:
            if rank == root:
                raise InvalidBufferError(f"scatter needs x at the root, rank {root}")
            if out is None:
                raise InvalidBufferError(
                    f"scatter needs out= (or x) on rank {rank}, which is not the root {root}, "
                    "to know the shape and dtype of its share"
                )
            like = out
            shares, share_shape = _scatter_shares(out, counts, size, rank)
        else:
            like = x
            shares, share_shape, _ = _shares("scatter", x, counts, size, rank, x.size)
        backend, _, item_bytes = _prepare(like, None, "scatter", algorithm)
        if out is not None:
            _check_out(backend, out, like, share_shape)
        total = sum(shares)
        work = backend.empty(total, like)
        if rank == root:
            backend.copy(work, x)
        dtype = backend.dtype_name(like)
    except Exception as error:
        _refuse(group, "scatter", algorithm, check, error)
        raise
    with _watch(group, "scatter", algorithm, total, dtype, None, root, counts, check, backend.name) as call:
        _route(group, call, backend, "scatter", algorithm, total, item_bytes)
        schedule = build_schedule("scatter", call.algorithm, size, total, shares, root=root)
        execute(schedule, call.transport, backend, work)
    lo = sum(shares[:rank])
    if out is None:
        out = backend.empty(shares[rank], like).reshape(share_shape)
    backend.copy(out, work[lo : lo + shares[rank]])
    return out


def _scatter_shares(
    out: Any, counts: Sequence[int] | None, size: int, rank: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Each rank's share and this rank's share's shape, told by ``out`` alone."""
    if counts is None:
        return (out.size,) * size, tuple(out.shape)
    shares, share_shape, _ = _shares("scatter", out, counts, size, rank, sum(int(c) for c in counts))
    return shares, share_shape


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
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.

    Returns:
        The shares from every rank, ``out`` when given.
    """
    group = _communicator(comm)
    try:
        x, out = adopt(x), adopt(out)  # other CUDA arrays as CuPy views, no copy
        backend, _, item_bytes = _prepare(x, None, "alltoall", algorithm)
        size, rank = group.size, group.rank
        shape = tuple(x.shape)
        _check_rows("alltoall", x, size)
        if out is not None:
            _check_out(backend, out, x, shape)
        count = x.size
        share = count // size
        # the schedule's buffer: the input, then the output (see collectives.specs)
        work = backend.empty(2 * count, x)
        backend.copy(work[:count], x)
        # no rank sends to itself, so its share for itself starts in its slot of the output
        mine = rank * share
        backend.copy(work[count + mine : count + mine + share], work[mine : mine + share])
    except Exception as error:
        _refuse(group, "alltoall", algorithm, check, error)
        raise
    dtype = backend.dtype_name(x)
    with _watch(group, "alltoall", algorithm, count, dtype, None, check=check, backend=backend.name) as call:
        _route(group, call, backend, "alltoall", algorithm, count, item_bytes)
        schedule = build_schedule("alltoall", call.algorithm, size, count)
        execute(schedule, call.transport, backend, work)
    result = work[count:]
    if out is None:
        return result.reshape(shape)
    backend.copy(out, result)
    return out


def barrier(
    comm: "Communicator | MPI.Comm | None" = None, *, algorithm: str = AUTO, check: bool | None = None
) -> None:
    """Return only once every rank of the communicator has called ``barrier``.

    Args:
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        algorithm: the algorithm's name, or ``"auto"`` for the selector's choice.
        check: agree with the other ranks on the call before running it, and raise
            :class:`~collectives.MismatchError` on every rank if they differ; the
            communicator's setting by default. The same on every rank.
    """
    import numpy as np  # the tokens are host bytes, whatever library the user's arrays are from

    group = _communicator(comm)
    try:
        check_algorithm("barrier", algorithm)
    except Exception as error:
        _refuse(group, "barrier", algorithm, check, error)
        raise
    with _watch(group, "barrier", algorithm, 0, check=check) as call:
        call.algorithm = _algorithm(group, "barrier", algorithm, 0, 1)
        schedule = build_schedule("barrier", call.algorithm, group.size, 0)
        tokens = np.zeros(schedule.count, np.uint8)
        execute(schedule, call.transport, backend_for(tokens), tokens, get_op("bor"))
