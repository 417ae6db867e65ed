"""The communicator a call runs on: the user's mpi4py communicator, its selector, watchdog, shared memory."""

__all__ = ["Communicator", "communicator_of", "default", "made_for"]

import json
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

from . import engine
from ._env import env_flag
from .backends import ArrayBackend
from .call import Call
from .errors import InvalidBufferError
from .execute import Scratch
from .execute_shared import SharedExecutor
from .selector import Selector
from .selector_agreement import agree_on_selector
from .settings_agreement import (
    NUMBER_KEY,
    SETTINGS_BYTES,
    Setting,
    compared,
    differences,
    number_in,
    settings_of,
)
from .shared_sizes import (
    OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES,
    OVERSUBSCRIBED_SEGMENT_BYTES,
    SEGMENT_BYTES,
    oversubscribed,
    scatter_small_bytes,
    small_bytes,
)
from .tracing.clock import align
from .tracing.recorder import TRACER, agreed
from .transport.base import NodeSplit, Transport
from .transport.device import GpuDevice
from .transport.device_path import CUDA_IPC_ENV, DevicePath
from .transport.tags import Tag
from .tuner import TUNE_ENV, Tuner, tuning_wanted
from .watch_settings import CHECK_ENV, flag
from .watchdog import Watchdog

if TYPE_CHECKING:
    from mpi4py import MPI


_STAGING_KEPT = 16
"""Pinned host buffers a communicator keeps (:meth:`Communicator.staging_buffer`); past it, all go."""


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
        tune: whether ``"auto"`` calls are tuned online (:mod:`collectives.tuner`): the
            best predicted algorithms timed on a call shape's first calls, the fastest
            kept; ``$COLLECTIVES_TUNE`` or off by default. The same on every rank.

    The settings that change what the ranks do (``check``, ``tune``,
    ``$COLLECTIVES_RANKS_PER_NODE``, ``$COLLECTIVES_CUDA_AWARE``, ``$COLLECTIVES_CUDA_IPC``)
    are compared as it is made, in a message exchange bounded by the timeout.

    Raises:
        MismatchError: on every rank, where the ranks' settings differ, naming each
            setting's value on each rank.
        ConfigurationError: a setting has a value that cannot be used (on every
            rank where that setting is compared, the others raising
            :class:`~collectives.MismatchError`).
        CollectiveTimeout: a rank did not take part in the comparison in time.

    Attributes:
        watchdog: numbers, checks, bounds and records every call (for the library's modules).
        scratch: buffers reused by every call, so repeated calls allocate nothing.
        repeats: repeated calls' kept decisions, by key (see :mod:`collectives.repeats`, which owns them).
        tuner: the online tuner, where tuning is on; else ``None``.
    """

    def __init__(
        self,
        comm: "MPI.Comm | Transport | None" = None,
        *,
        timeout: float | None = None,
        stall_warning: float | None = None,
        check: bool | None = None,
        tune: bool | None = None,
    ) -> None:
        checks, tunes = compared(flag, check, CHECK_ENV, True), compared(tuning_wanted, tune)
        self.tuner: Tuner | None = Tuner() if tunes.value else None
        self._selector: Selector | None = None  # agreed on the first algorithm="auto"
        self._shared: SharedExecutor | None = None
        self._nodes: NodeSplit | None = None  # where the ranks span several nodes
        self._node_shared: SharedExecutor | None = None  # over this rank's node then
        self._features: frozenset[str] | None = None  # what the transport offers, asked once
        self._device_paths: dict[str, DevicePath] = {}  # by backend: made on the first device call
        self._staging: dict[tuple[int, int], Any] = {}  # pinned host buffers, by thread and size
        self._sibling: Communicator | None = None
        self._before_free: list[Callable[[], None]] = []
        # plain attributes, not properties: a repeated small call reads them in a few microseconds
        self.scratch = Scratch()
        self.repeats: dict[tuple[Any, ...], Any] = {}  # repeats.Repeat entries: that module owns them
        if isinstance(comm, Transport):
            self._transport = comm
        else:
            from .transport.mpi import MPITransport

            self._transport = MPITransport(comm)
        # an unusable check is raised after the comparison, so that the other ranks raise too
        checked = checks.value is not False
        self.watchdog = Watchdog(self._transport, timeout=timeout, stall_warning=stall_warning, check=checked)
        settings = {f"{CHECK_ENV} or check=": checks, f"{TUNE_ENV} or tune=": tunes}
        settings[CUDA_IPC_ENV] = compared(env_flag, CUDA_IPC_ENV)
        # where one rank reduces in the engine and another in numpy, two NaNs could leave them different bits
        settings[f"the compiled engine ({engine.FLAG})"] = compared(engine.compiled)
        if self._transport.FINDS_NODES_TOGETHER:  # the MPI transport's own: read where mpi4py is imported
            from .transport.mpi import CUDA_AWARE_ENV, RANKS_PER_NODE_ENV, ranks_per_node

            settings[RANKS_PER_NODE_ENV] = compared(lambda: ranks_per_node() or None)  # 0: unset
            settings[CUDA_AWARE_ENV] = compared(env_flag, CUDA_AWARE_ENV)
        self._agree_on_settings(settings)
        if TRACER.on:  # the ranks' clocks against rank 0's, for the trace's one timeline
            align(self._transport, self.watchdog.number, TRACER.clock)

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
        features = self._features
        if features is not None:
            return features
        # a call of its own, so that a rank that never asks makes the others time out, not hang in MPI
        watchdog = self.watchdog
        with watchdog.watch(watchdog.signature_of("features", "-", 0)) as call:
            return self.features_in(call)

    def features_in(self, call: Call) -> frozenset[str]:
        """:attr:`features`, asked inside ``call``: the first time, under its deadline.

        Finding the nodes over MPI is MPI's collective (``Split_type``, a shared
        window), which no timeout can bound, so first the ranks meet by messages the
        watchdog bounds: a rank that never comes makes the others raise
        :class:`~collectives.CollectiveTimeout` here instead of waiting in MPI.
        """
        features = self._features
        if features is not None:
            return features
        self._meet(call, "the node split")
        return self._find_features()

    def _meet(self, call: Call, step: str) -> None:
        """Meet the other ranks by messages ``call``'s deadline bounds, before a setup MPI cannot bound.

        Finding the nodes (``Split_type``, a shared window) is MPI's collective, which
        no timeout can bound: a rank that never comes makes the others raise
        :class:`~collectives.CollectiveTimeout` here, naming ``step``, instead of
        waiting in MPI.
        """
        if self.size > 1 and self._transport.FINDS_NODES_TOGETHER:
            self._meet_by_messages(call, step)

    def _meet_by_messages(self, call: Call, step: str, record: bytes = b"\0") -> list[bytes]:
        """Meet the other ranks under ``call``'s deadline: every rank has sent, and heard every other.

        The first round carries ``record`` (of one size on every rank); returns the
        record each rank sent, by rank (this rank's own too).
        """
        records = [record] * self.size
        if self.size > 1:
            # twice: a late rank finds the first messages of ranks that sent them and then timed
            # out; a rank sends its second only once it has every first, so the late one times out too
            transport = self._transport
            peers = _peers(transport)
            for round_, sent in enumerate((record, b"\0")):
                theirs = [bytearray(len(sent)) for _ in peers]
                mine = [(bytearray(sent), peer) for peer in peers]
                call.exchange(transport, mine, list(zip(theirs, peers, strict=True)), Tag.NODES, step)
                if round_ == 0:
                    for peer, heard in zip(peers, theirs, strict=True):
                        records[peer] = bytes(heard)
        return records

    def _agree_on_settings(self, settings: "dict[str, Setting]") -> None:
        """Compare ``settings`` with the other ranks' in the setup's bounded exchange; raise if they differ.

        Before anything that acts on them: a pretend node split on one rank only
        would wait in MPI for ever, checks or tuning on one rank only pair the calls
        wrongly. Where the transport has no nodes to find (a loopback transport,
        whose ranks share one environment) nothing is sent.
        """
        shown = {name: setting.shown for name, setting in settings.items()}
        problem: Exception | None = next((s.problem for s in settings.values() if s.problem), None)
        if self.size > 1 and self._transport.FINDS_NODES_TOGETHER:
            # short texts of ours (no raw values), so the record always fits
            record = json.dumps({**shown, NUMBER_KEY: self.watchdog.number}).encode().ljust(SETTINGS_BYTES)
            watchdog = self.watchdog
            # unnumbered and unrecorded: a creation is no collective call ($COLLECTIVES_FAULT counts calls)
            watchdog.claim("setup")
            with Call(watchdog, watchdog.signature_of("setup", "-", 0).signature, watchdog.sequence) as call:
                records = self._meet_by_messages(call, "the settings' comparison", record)
            differ = differences([settings_of(r) for r in records])
            numbers = [number_in(r) for r in records]
            if None not in numbers:  # one name for the communicator in every rank's trace
                watchdog.number = agreed(watchdog, watchdog.number, cast("list[int]", numbers))
            if problem is None and differ is not None:
                problem = differ
        if problem is not None:
            if self._transport.FINDS_NODES_TOGETHER:  # made for this communicator; every rank raises here
                self._transport.close(self.watchdog.timeout)
            raise problem

    def _find_features(self) -> frozenset[str]:
        """Ask the transport for its shared memory or node split (collective), and set up the executors."""
        shared = self._transport.shared_memory()
        nodes = None if shared is not None else self._transport.node_split()
        node_ranks = self.size if shared is not None else len(nodes.node_ranks) if nodes else 1
        # then barriers are dear: fewer, longer segments (emulated nodes share one machine's cores)
        crowded = oversubscribed(max(node_ranks, self._transport.host_ranks()))
        segment = OVERSUBSCRIBED_SEGMENT_BYTES if crowded else SEGMENT_BYTES
        rooted = OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES if crowded else SEGMENT_BYTES
        extra: tuple[str, ...] = ("oversubscribed",) if crowded else ()
        if shared is not None:
            # the compiled engine's reduction wins one barrier further (the ranks agree whether it runs)
            compiled = engine.COMPILED is not None
            small, scatter = small_bytes(self.size, compiled), scatter_small_bytes(self.size, compiled)
            extra += ("compiled",) if compiled else ()
            self._shared = SharedExecutor(shared, self.rank, self.size, segment, small, rooted, scatter)
            # from the next call on, the ranks agree on signatures through a barrier, not messages,
            # so no data travels with them: forget the calls prepared to send it so
            self.watchdog.agree_through(shared, self._shared.reset)
            self.repeats.clear()
            features = frozenset({"shared_memory", *extra})
        elif nodes is not None:
            self._nodes = nodes
            self._node_shared = SharedExecutor(
                nodes.shared,
                nodes.node_ranks.index(self.rank),
                len(nodes.node_ranks),
                segment,
                rooted_segment_bytes=rooted,
            )
            features = frozenset({"shared_memory_nodes", f"ranks_per_node={len(nodes.node_ranks)}", *extra})
        else:
            features = frozenset()
        self._features = features
        return features

    @property
    def known_features(self) -> frozenset[str] | None:
        """:attr:`features` if an earlier call found them, else ``None``; never collective."""
        return self._features

    @property
    def shared(self) -> SharedExecutor | None:
        """The shared-memory executor over all ranks, once :attr:`features` found them on one node."""
        return self._shared

    @property
    def nodes(self) -> tuple[NodeSplit, SharedExecutor] | None:
        """This rank's node split and the executor over its node, once :attr:`features` found several."""
        if self._nodes is None or self._node_shared is None:
            return None
        return self._nodes, self._node_shared

    @property
    def selector(self) -> Selector | None:
        """The selector the ranks agreed on (rank 0's), or ``None`` before the first ``"auto"`` call."""
        return self._selector

    def agreed_selector(self, call: Call) -> Selector:
        """Rank 0's selector, on every rank; the first time, the ranks agree on it under ``call``'s deadline.

        Rank 0 loads the calibration for this communicator's size. Ranks whose
        calibrations differ would choose different algorithms and wait on each other
        forever, so they all take rank 0's constants.

        Raises:
            CalibrationError: rank 0 could not load its calibration (on every rank).
            CollectiveTimeout: rank 0's constants did not come in time.
        """
        selector = self._selector
        if selector is None:
            # on several nodes, rank 0 reads the calibration of the job's shape (both classes of link)
            nodes = 1 if self._nodes is None else self.size // len(self._nodes.node_ranks)
            selector = self._selector = agree_on_selector(call, self._transport, nodes)
        return selector

    @property
    def device_path(self) -> str | None:
        """How device arrays travel: ``"cuda ipc"``, ``"cuda-aware mpi"`` or ``"host staging"``.

        ``None`` until the first collective on device arrays chooses it (collectively;
        see :func:`collectives.transport.device_path.connect`).
        """
        path = self.chosen_device_path
        return None if path is None else path.name

    @property
    def chosen_device_path(self) -> DevicePath | None:
        """The path device arrays take, once the first collective on them chose it; never collective."""
        return next(iter(self._device_paths.values()), None)

    def staging_buffer(self, device: GpuDevice, nbytes: int) -> Any:
        """A pinned host buffer of ``nbytes`` for this thread's host copies of device arrays, kept.

        One per thread: a thread's copy never lands in a buffer another thread's call is
        reading (that call then fails as any concurrent call does, never reads a wrong sum).
        """
        key = (threading.get_ident(), nbytes)
        buffer = self._staging.get(key)
        if buffer is None:
            if len(self._staging) >= _STAGING_KEPT:
                self._staging.clear()  # start afresh rather than evict one by one
            buffer = self._staging[key] = device.pinned(nbytes)
        return buffer

    def device_path_of(self, backend: ArrayBackend, call: Call | None = None) -> DevicePath | None:
        """The path of ``backend``'s device arrays, made on first use (collective); ``None`` on the host.

        Made inside ``call``, the ranks first meet under its deadline (see :meth:`features_in`),
        as choosing the path asks MPI which ranks share a node.
        """
        path = self._device_paths.get(backend.name)
        if path is None:
            device = backend.device()
            if device is None:
                return None
            from .transport.device_path import connect

            if call is not None:
                self._meet(call, "the device path")
            path = self._device_paths[backend.name] = connect(self._transport, device)
        return path

    @property
    def timeout(self) -> float:
        """Seconds a collective may take; ``math.inf`` for no limit."""
        return self.watchdog.timeout

    def alloc(self, shape: "int | Sequence[int]", dtype: Any = "float32") -> Any:
        """A numpy array in memory every rank of the node maps, for collectives that need no copy.

        An allreduce in place (``out=x``) or a reduce_scatter of such an array, with
        the ``shared_memory`` algorithm (or ``"auto"`` choosing it), reads the
        other ranks' data where it already lies instead of copying it through a
        window first. Every rank must pass such an array or none may (a
        :class:`~collectives.MismatchError` says so otherwise).

        Collective: every rank of the communicator calls it, in the same order
        (each gets its own array; shapes may differ); a rank that does not makes the
        others raise :class:`~collectives.CollectiveTimeout` within the timeout. The memory lives until
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
        watchdog = self.watchdog
        # a call: raises FreedCommunicatorError once freed; and the ranks meet under its deadline before
        # MPI's collectives (the node split, the shared window), which a rank that never comes would hang
        with watchdog.watch(watchdog.signature_of("alloc", "-", 0)) as call:
            if "shared_memory" not in self.features_in(call) or self._shared is None:
                return np.empty(dims, kind)
            self._meet(call, "alloc's shared window")
            # padded, so every allocation starts on a cache line and a zero-size one still exists
            memory = self._shared.alloc(max(-(-nbytes // 64) * 64, 64))
        return np.frombuffer(memory, np.uint8, nbytes).view(kind).reshape(dims)

    def sibling(self) -> "Communicator":
        """A communicator over the same ranks with its own messages, for a background thread's calls.

        Made on the first call (collective, like creating one), then the same one;
        freed with this one. Where the transport cannot be duplicated (a loopback
        transport) it is this communicator itself.
        """
        if self._sibling is None:
            sibling = self.duplicate()
            if sibling is None:
                return self
            self._sibling = sibling
        return self._sibling

    def duplicate(self, timeout: float | None = None) -> "Communicator | None":
        """A new communicator over the same ranks, with the same settings and messages of its own; collective.

        The ranks first meet by messages under this communicator's timeout, so a rank
        that never calls makes the others raise :class:`~collectives.CollectiveTimeout`
        instead of waiting in MPI's ``Comm_dup``. The caller frees the new one.
        ``None`` where the transport cannot be duplicated (a loopback transport).

        Args:
            timeout: the new communicator's timeout; this one's by default.
        """
        if not self._transport.DUPLICATES:
            return None
        watchdog = self.watchdog
        with watchdog.watch(watchdog.signature_of("duplicate", "-", 0)) as call:
            self._meet_by_messages(call, "the duplicate")
            transport = self._transport.duplicate()
        if transport is None:
            return None
        limit = watchdog.timeout if timeout is None else timeout
        stall, check, tune = watchdog.stall_warning, watchdog.check, self.tuner is not None
        return Communicator(transport, timeout=limit, stall_warning=stall, check=check, tune=tune)

    def flight_record(self) -> list[str]:
        """This rank's last collectives on the communicator, oldest first, one line each."""
        return self.watchdog.flight_record()

    def before_free(self, finish: Callable[[], None]) -> None:
        """Run ``finish`` when :meth:`free` begins (the lane of non-blocking calls waits for them there)."""
        self._before_free.append(finish)

    def free(self) -> None:
        """Release the library's duplicate communicator; collective, like creating it.

        Waits at most :attr:`timeout` for the other ranks (a few seconds where the
        communicator broke): where they do not all come, the shared memory is kept
        until the process ends instead of freed, so that no rank waits for ever.
        Every later collective on it raises :class:`~collectives.FreedCommunicatorError`;
        freeing it again does nothing.
        """
        watchdog = self.watchdog
        if watchdog.freed:
            return
        for finish in self._before_free:  # calls started on it complete first, as MPI's would
            finish()
        if watchdog.broken is not None:  # receives of a call that did not finish may still land in them
            watchdog.kept.append((self.scratch, list(self.repeats.values())))
            self.scratch = Scratch()
        watchdog.freed = True
        watchdog.break_off("it was freed")
        if self._sibling is not None:
            self._sibling.free()
        self.scratch.clear()
        for path in self._device_paths.values():
            path.close()
        self._device_paths.clear()
        self.repeats.clear()
        # freeing shared windows is MPI's collective: bounded, as peers of a broken one may never come
        self._transport.close(self.timeout)

    def __repr__(self) -> str:
        return f"Communicator(rank={self.rank}, size={self.size}, transport={type(self._transport).__name__})"


default: Communicator | None = None
"""The communicator over ``MPI.COMM_WORLD``, once a call without ``comm=`` made it."""

_wrapped: list[tuple["weakref.ref[Any]", Communicator]] = []


def communicator_of(comm: "Communicator | MPI.Comm | None") -> Communicator:
    """The communicator a call with ``comm=comm`` runs on.

    ``comm`` itself if it is one; for ``None``, the one over ``MPI.COMM_WORLD``,
    made on the first such call; for an mpi4py communicator, one over it, made on
    its first call and reused while it lives (collective, as making one is).
    """
    global default
    made = made_for(comm)
    if made is not None:
        return made
    if comm is None:
        default = Communicator()
        return default
    # an mpi4py communicator: duplicate it once and reuse that (mpi4py comms are not hashable)
    wrapper = Communicator(cast("MPI.Comm", comm))  # not one made already: not a Communicator
    _wrapped[:] = [(r, w) for r, w in _wrapped if r() is not None]
    _wrapped.append((weakref.ref(comm), wrapper))
    return wrapper


def made_for(comm: "Communicator | MPI.Comm | None") -> Communicator | None:
    """The communicator a call with ``comm=comm`` ran on, if one was made; never makes one."""
    if comm is None or isinstance(comm, Communicator):
        return default if comm is None else comm
    return next((wrapper for ref, wrapper in _wrapped if ref() is comm), None)


def _peers(transport: Transport) -> list[int]:
    return [peer for peer in range(transport.size) if peer != transport.rank]
