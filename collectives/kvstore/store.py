"""The worker's side of the store: init, push, pull and their handles, clocks, barriers and close."""

__all__ = ["MODES", "KVStore", "create"]

import math
import os
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    ConfigurationError,
    KVStoreError,
    KVStoreTimeout,
    TransportError,
)
from ..ops import ReduceOp, get_op
from ._adapter import Channel, open_channel
from ._wire import Kind, check_key
from .collective import Rounds, number_store
from .handles import Handle, Pulled, ServerRequest, checked_value, claimed, error_from, filler
from .layout import DEFAULT_PARTITION_BYTES, Roles
from .link import GRACE_S, WorkerLink
from .replicas import restore_states, state_of
from .rows import pull_rows, push_rows
from .saving import load_store, save_store
from .server import Server
from .updaters import Optimizer, Updater

if TYPE_CHECKING:
    from mpi4py import MPI

    from ..communicator import Communicator
    from ..transport.base import Transport

MODES = ("sync", "async", "ssp")
"""The consistency modes (see :func:`create`)."""


class KVStore:
    """A sharded key-value store over the ranks of a communicator; made by :func:`create`.

    Keys are ints (not bools) or non-empty strs; values are numpy arrays. Every worker calls
    :meth:`init` for each key with a value of the same shape and dtype;
    afterwards any worker may push to and pull from it. See :func:`create` for
    the modes' exact guarantees.
    """

    def __init__(
        self,
        channel: Channel,
        roles: Roles,
        mode: str,
        staleness: int,
        op: ReduceOp,
        partition_bytes: int,
        collective: bool = True,
        *,
        server: Server | None = None,
    ) -> None:
        """A store over ``channel``; ``server`` is this rank's own, if it serves.

        A dedicated server rank's store is closed from the start (its :func:`create` serves,
        then returns it); a colocated server answers on a thread started here.
        """
        self._channel = channel
        self._roles = roles
        self.mode = mode
        self.staleness = staleness
        self._op = op
        self._link = WorkerLink(channel, roles, mode, partition_bytes)  # what the helpers are given
        self._keys = self._link.keys
        self._rounds: Rounds | None = None  # sync rounds by collectives: see create(collective=)
        self.claim = self._link.claim  # one thread's call at a time
        if server is None:
            return
        self._link.server = server
        if collective and mode == "sync" and not roles.dedicated:
            self._rounds = Rounds(channel, server, op)
            self._link.collective = True
        if not roles.is_worker(channel.rank):
            self._closed = True
            return
        thread = self._link.thread = threading.Thread(
            target=server.serve, name=f"kvstore-server-{channel.rank}", daemon=True
        )
        thread.start()

    @property
    def _closed(self) -> bool:
        return self._link.closed

    @_closed.setter
    def _closed(self, closed: bool) -> None:
        self._link.closed = closed

    # what the store is

    @property
    def rank(self) -> int:
        """This worker's rank among the workers (its rank in the communicator too)."""
        return self._channel.rank

    @property
    def role(self) -> str:
        """``"worker"`` (which also serves when servers are colocated) or ``"server"`` (a dedicated one)."""
        return "worker" if self._roles.is_worker(self._channel.rank) else "server"

    @property
    def num_workers(self) -> int:
        return self._roles.num_workers

    @property
    def num_servers(self) -> int:
        return self._roles.num_servers

    @property
    def clock_value(self) -> int:
        """The clock this worker is at: how many times it called :meth:`clock`."""
        return self._link.clock

    def explain(self, key: Any) -> str:
        """Where each partition of ``key`` lives, one line each."""
        meta = self._link.meta(key)
        item = meta.dtype.itemsize
        lines = [
            f"key {key!r}: {meta.dtype.name}{list(meta.shape)}, {len(meta.parts)} partition(s) "
            f"over {self.num_servers} server(s), mode {self.mode}"
        ]
        for p in meta.parts:
            lines.append(
                f"  partition {p.index}: elements {p.lo}..{p.hi} ({(p.hi - p.lo) * item} bytes) "
                f"on server rank {p.server}"
            )
        return "\n".join(lines)

    # keys

    @claimed
    def init(self, key: Any, value: Any = None) -> None:
        """Make ``key`` (or each of a list of keys) with rank 0's value; returns once its servers hold it.

        Collective over the workers: each passes a value of the same shape and
        dtype (only worker 0's contents are used).

        Raises:
            KeyMismatchError: workers passed different shapes or dtypes (on each that differs from worker 0).
            KVStoreError: the key exists already.
        """
        keys, values = self._pairs(key, value)
        requests = []
        for k, v in zip(keys, values, strict=True):
            if k in self._keys:
                raise KVStoreError(f"key {k!r} is initialised already")
            array = np.ascontiguousarray(v)
            meta = self._keys[k] = self._link.layout(k, tuple(array.shape), array.dtype)
            flat = array.reshape(-1)
            for p in meta.parts:
                data = flat[p.lo : p.hi] if self.rank == 0 else None
                requests.append(self._link.send(Kind.INIT, k, p, text=meta.description, data=data))
        try:
            Handle(self._link, requests, lambda: None).wait()
        except KVStoreError:
            for k in keys:
                self._keys.pop(k, None)
            raise

    @claimed
    def push(self, key: Any, value: Any = None, *, rows: Any = None, block: bool = True) -> Any:
        """Push ``value`` to ``key`` (or values to a list of keys).

        ``sync``: the value joins this worker's next round of the key; ``async``
        and ``ssp``: the server applies it on arrival (``ssp`` stamps it with
        this worker's clock).

        Args:
            rows: for a key of 2 or more dimensions, the distinct indices (along
                the first axis) of the rows ``value`` holds, in its order: only
                those rows travel and are updated.

        Returns:
            ``None``, or a :class:`Handle` when ``block=False``.
        """
        if rows is not None:
            handle = push_rows(self._link, key, value, rows)
            return handle if not block else handle.wait()
        rounds = self._rounds
        if rounds is not None and block and not self._link.closed and rounds.push_one(key, value, self._keys):
            return None  # the repeated push of one key: its plan, checked once
        keys, values = self._pairs(key, value)
        if self._rounds is not None:
            self._rounds.push_keys([(k, self._link.meta(k), v) for k, v in zip(keys, values, strict=True)])
            return None if block else Handle(self._link, [], lambda: None)
        requests = []
        for k, v in zip(keys, values, strict=True):
            meta = self._link.meta(k)
            array = checked_value(k, meta, v, self.rank)
            stamp = meta.pushes if self.mode == "sync" else self._link.clock
            meta.pushes += 1
            for p in meta.parts:
                requests.append(self._link.send(Kind.PUSH, k, p, stamp=stamp, data=array[p.lo : p.hi]))
        handle = Handle(self._link, requests, lambda: None)
        return handle if not block else handle.wait()

    @claimed
    def pull(
        self, key: Any, out: Any = None, *, rows: Any = None, block: bool = True, report: bool = False
    ) -> Any:
        """The value of ``key`` (or a list of keys), into ``out`` when given.

        ``sync``: after this worker's round-t push, the aggregate of every
        worker's round-t push (after the updater), waiting for it; ``async``:
        the server's current value; ``ssp``: at clock c, a value that includes
        every worker's pushes of clocks <= c - staleness - 1, waiting until it does.

        Args:
            out: an array (or list of arrays) of the key's shape and dtype.
            block: ``False`` returns a :class:`Handle` whose ``wait()`` gives the result.
            rows: for a key of 2 or more dimensions, the distinct row indices to
                pull: the result holds those rows, in that order.
            report: return :class:`Pulled` (the value and the clocks or rounds it includes).
        """
        if rows is not None:
            handle = pull_rows(self._link, key, out, rows, report)
            return handle if not block else handle.wait()
        one = type(out) is np.ndarray and not isinstance(key, list | tuple)
        if one and block and not report and self._rounds is None:
            return self._pull_one(key, out)
        keys, outs = self._outs("pull", key, out)
        if self._rounds is not None:
            items = [(k, self._link.meta(k), o) for k, o in zip(keys, outs, strict=True)]
            got = self._rounds.pull_keys(items, report)
            done = got if isinstance(key, list | tuple) else got[0]
            return done if block else Handle(self._link, [], lambda: done)
        requests: list[ServerRequest] = []
        results: list[np.ndarray] = []
        stamps: list[list[int]] = []
        for k, o in zip(keys, outs, strict=True):
            meta = self._link.meta(k)
            target = np.empty(meta.shape, meta.dtype) if o is None else o  # an out _outs checked
            flat = target.reshape(-1)  # a view: the out is C-contiguous
            results.append(target)
            seen = [0] * len(meta.parts)
            stamps.append(seen)
            stamp = meta.pushes if self.mode == "sync" else self._link.clock
            for p in meta.parts:
                requests.append(
                    self._link.send(Kind.PULL, k, p, stamp=stamp, on_data=filler(flat, p, meta.dtype, seen))
                )

        def result() -> Any:
            got: list[Any] = results
            if report:
                got = [Pulled(v, tuple(s)) for v, s in zip(results, stamps, strict=True)]
            return got if isinstance(key, list | tuple) else got[0]

        handle = Handle(self._link, requests, result)
        return handle if not block else handle.wait()

    def _pull_one(self, key: Any, out: np.ndarray) -> np.ndarray:
        """:meth:`pull` of one key into ``out`` by messages, waiting: no lists, no handle.

        The same requests, checks and errors as the general path; a training loop's pull
        is this one, and its Python is paid again by the serving rank (docs/kvstore.md).
        """
        link = self._link
        meta = link.meta(key)
        if out.shape != meta.shape or out.dtype != meta.dtype or not out.flags.c_contiguous:
            checked_value(key, meta, out, self.rank, out=True)  # raises, naming what is wrong
        flat = out.reshape(-1)
        seen = [0] * len(meta.parts)
        stamp = meta.pushes if self.mode == "sync" else link.clock
        requests = [
            link.send(Kind.PULL, key, p, stamp=stamp, on_data=filler(flat, p, meta.dtype, seen))
            for p in meta.parts
        ]
        link.wait_for(requests)
        for request in requests:
            if request.error is not None:
                raise error_from(request)
        return out

    @claimed
    def pushpull(
        self, key: Any, value: Any = None, out: Any = None, *, rows: Any = None, block: bool = True
    ) -> Any:
        """:meth:`push` then :meth:`pull`; the pulled value(s), or a handle.

        In ``sync`` mode over colocated servers (unless ``create(collective=False)``)
        this is one round of collectives over all workers (see
        :class:`~collectives.kvstore.collective.Rounds`), as :meth:`push` and
        :meth:`pull` are there. Otherwise the push and the pull are sent together.
        """
        rounds = self._rounds
        if rounds is not None and rows is None:
            if block and not self._link.closed:  # the repeated call of one key: its plan, checked once
                planned = rounds.pushpull_one(key, value, out, self._keys)
                if planned is not None:
                    return planned
            keys, values = self._pairs(key, value)
            _, outs = self._outs("pushpull", key, out)
            items = [(k, self._link.meta(k), v, o) for k, v, o in zip(keys, values, outs, strict=True)]
            got = rounds.pushpull_keys(items)
            done = got if isinstance(key, list | tuple) else got[0]
            return done if block else Handle(self._link, [], lambda: done)
        if rows is None:
            self._outs("pushpull", key, out)  # a bad out raises before the push goes, which would be applied
        first = self.push(key, value, rows=rows, block=False)
        second = self.pull(key, out, rows=rows, block=False)
        handle = first.followed_by(second)
        return handle if not block else handle.wait()

    # server-side updates

    @claimed
    def set_updater(self, fn: Updater) -> None:
        """Run ``fn(key, received, stored) -> new stored`` on the servers for each push; collective.

        ``received`` is a sync round's aggregate, or one push in ``async`` and
        ``ssp``. Dedicated servers cannot receive a function: pass
        ``updater=`` to :func:`create` on every rank instead.
        """
        if self._roles.dedicated:
            raise ConfigurationError("dedicated servers take an updater only from create(..., updater=fn)")
        assert self._link.server is not None
        self._link.server.optimizer = None
        self._link.server.updater = fn
        self.barrier()
        if self._rounds is not None:  # the servers no longer simply assign: plans made for that go
            self._rounds.forget()

    @claimed
    def set_optimizer(self, optimizer: Optimizer) -> None:
        """Run ``optimizer`` (:class:`~collectives.kvstore.SGD` or ``Adam``) on the servers.

        Workers then push gradients and pull parameters. Collective over the
        workers; worker 0's optimizer is the one used.
        """
        self._link.optimizer = optimizer
        if self.rank == 0:
            Handle(self._link, [self._link.send(Kind.OPTIMIZER, None, server=s, text=optimizer.spec())
                          for s in self._roles.server_ranks], lambda: None).wait()  # fmt: skip
        self.barrier()
        if self._rounds is not None:
            self._rounds.forget()

    # synchronisation

    @claimed
    def clock(self) -> None:
        """End this worker's iteration (``ssp``; allowed in every mode): its clock goes up by one."""
        self._link.clock += 1
        Handle(self._link, [self._link.send(Kind.CLOCK, None, server=s, stamp=self._link.clock)
                      for s in self._roles.server_ranks], lambda: None).wait()  # fmt: skip

    @claimed
    def barrier(self) -> None:
        """Return once every open worker has called it."""
        self._link.barrier()

    # checkpoints

    @claimed
    def save(self, directory: "str | os.PathLike[str]") -> None:
        """Write every server's shard, and its optimizer state, to ``directory``; collective over workers.

        Every worker's earlier requests complete first and no worker pushes until
        all shards are written, so the shards are of one point (the same round or
        clock on every server). Each shard and then the manifest are written to a
        temporary file and renamed into place; the manifest, written last, names
        the checkpoint's id, which every shard carries, so a half-written or mixed
        checkpoint is refused by :meth:`load`. A ``set_updater`` function is not
        saved (set it again after loading); an optimizer is.

        Raises:
            KVStoreError: a shard or the manifest could not be written (on every worker).
        """
        save_store(self._link, directory)

    @claimed
    def load(self, directory: "str | os.PathLike[str]") -> None:
        """Restore a checkpoint :meth:`save` wrote, onto any number of servers; collective over workers.

        Call it on a new store, before any :meth:`init`: it makes the checkpoint's
        keys with their values, rounds, clock and optimizer state, cut into this
        store's partitions.

        Raises:
            KVStoreError: the directory is missing, the checkpoint is partial or of
                another format or mode, or this store has keys already.
        """
        load_store(self._link, directory)

    def state(self) -> dict[str, Any]:
        """This rank's shards as a picklable dict, for in-memory replicas; colocated servers only.

        Holds the partitions this rank's server keeps (values, rounds, optimizer
        state) and the keys' layout, as of this worker's completed requests. Take
        it at the same point on every rank (after a round, before
        ``Checkpointer.checkpoint``), and keep it with the checkpoint: its
        replica is what :meth:`restore` gives the survivors of this rank's death.
        """
        return state_of(self._link)

    @claimed
    def restore(self, states: list[dict[str, Any]]) -> None:
        """Take every key back from :meth:`state` dicts, cut anew over this store's servers; collective.

        Call it on a new store (colocated, no keys yet) over the survivors of a
        death, each rank passing its own state first and then those it adopted
        (:attr:`~collectives.resilience.Recovery.adopted`): the lost servers'
        partitions come from their replicas. Rounds, clock and optimizer state
        come back too, so training goes on as from the states' point.

        Raises:
            KVStoreError: (on every rank) a key that no state passed holds whole,
                or states of another mode; ConfigurationError: dedicated servers.
        """
        restore_states(self._link, states)

    def close(self) -> None:
        """Leave the store; the others carry on without this worker (a ``sync`` round no longer waits for it).

        On a colocated rank the server goes on serving the others, so this returns
        once every worker has closed (or raises :class:`KVStoreTimeout` naming those
        that have not within the timeout). Idempotent.
        """
        link = self._link
        if link.left or (self._closed and link.broken is None):
            return  # closed, or a dedicated server's store (a broken store is still closed: the servers wait)
        link.left = self._closed = True
        try:
            if link.broken is not None:  # told by one server: a server not told yet must not
                for s in self._roles.server_ranks:  # complete the others' rounds without this worker
                    link.send(Kind.BREAK, None, server=s, text=link.broken)
            requests = [link.send(Kind.CLOSE, None, server=s) for s in self._roles.server_ranks]
            link.wait_for(requests)
            thread = link.thread
            if thread is not None and link.server is not None:
                limit = self._channel.timeout + GRACE_S
                thread.join(None if math.isinf(limit) else limit)
                if thread.is_alive():
                    link.server.stopping.set()
                    still = tuple(sorted(link.server.open))
                    raise KVStoreTimeout(
                        f"close: rank {self.rank} waited {self._channel.timeout:g} s "
                        f"for workers {list(still)} to close",
                        workers=still,
                    )
                if link.server.error is not None:
                    raise KVStoreError(f"the server on rank {self.rank} failed: {link.server.error!r}")
            try:
                self._channel.flush(min(self._channel.timeout, 30.0))
            except TransportError as error:  # a dead server (ULFM)
                raise link.failed(error, requests) from error
        except BaseException as error:  # close's boundary: an interrupt breaks the store (the close goes)
            link.escaped("close", error)
            raise
        finally:
            self._release()

    def _release(self) -> None:
        if self._link.thread is None or not self._link.thread.is_alive():
            self._channel.close()

    def __enter__(self) -> "KVStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # messages

    def _pairs(self, key: Any, value: Any) -> tuple[list[Any], list[Any]]:
        if self._closed:
            raise self._link.unusable()
        keys = list(key) if isinstance(key, list | tuple) else [key]
        for k in keys:  # every key checked before any is sent
            check_key(k)
        if isinstance(key, list | tuple):
            values = list(value) if isinstance(value, list | tuple) else []
            if len(values) != len(key):
                raise KVStoreError(f"{len(key)} keys need as many values, got {len(values)}")
            return keys, values
        return keys, [value]

    def _outs(self, what: str, key: Any, out: Any) -> tuple[list[Any], list[Any]]:
        """The keys of a pull and their outs (``None`` for a new array), every out checked."""
        keys = list(key) if isinstance(key, list | tuple) else [key]
        outs = list(out) if isinstance(out, list | tuple) else [out] * len(keys)
        if len(outs) != len(keys):
            raise KVStoreError(f"{what} of {len(keys)} keys got {len(outs)} outs")
        for k, o in zip(keys, outs, strict=True):
            if o is not None:
                checked_value(k, self._link.meta(k), o, self.rank, out=True)
        return keys, outs


def create(
    mode: str = "sync",
    *,
    staleness: int = 0,
    comm: "Communicator | MPI.Comm | Transport | None" = None,
    servers: int | None = None,
    partition_bytes: int = DEFAULT_PARTITION_BYTES,
    op: "str | ReduceOp" = "sum",
    updater: Updater | None = None,
    timeout: float | None = None,
    collective: bool = True,
    reproducible: bool = False,
) -> KVStore:
    """Make a key-value store over the ranks of ``comm``; collective over them.

    Modes, for a key pushed by every worker:

    * ``"sync"`` (BSP): each worker's t-th push of a key is its round t; the
      server aggregates a round once every open worker has pushed it, combining
      the pushes by ``op`` in worker order (so the result has the same bits on
      every rank and every run) and applies the updater (default: the stored
      value becomes the aggregate). A pull made after a worker's round-t push
      returns the value after round t, waiting for it.
    * ``"async"`` (ASP): the server applies each push as it arrives (default
      updater: ``stored = op(stored, push)``) and a pull returns the current
      value; no worker waits for another. A partition is updated whole between
      pulls, so no pull sees half an update.
    * ``"ssp"`` (stale synchronous parallel, bounded staleness ``s``): as
      ``async``, and each worker calls :meth:`KVStore.clock` at the end of an
      iteration; a pull made at clock c returns a value that includes every
      worker's pushes of clocks <= c - s - 1, waiting until it does.
      ``s = 0`` gives BSP's guarantee (updates applied in arrival order).

    Roles: by default every rank is a worker and a server (colocated; a server
    thread answers while the worker computes, which needs MPI's
    ``THREAD_MULTIPLE``). ``servers=k`` makes the last k ranks dedicated servers:
    on them this call serves until every worker has closed the store and then
    returns a closed store whose :attr:`KVStore.role` is ``"server"``, so a
    script reads ``kv = create(...)``, then ``if kv.role == "worker": ...``.

    Args:
        mode: ``"sync"``, ``"async"`` or ``"ssp"``.
        staleness: ``ssp``'s bound s (>= 0).
        comm: a Communicator, an mpi4py communicator or a transport; ``MPI.COMM_WORLD``
            by default. The store's messages go on a duplicate of it.
        servers: the number of dedicated server ranks; ``None`` for colocated servers.
        partition_bytes: values larger than this are cut into partitions spread over the servers.
        op: the reducer (``sum``, ``max``, ``min``, ... of :mod:`collectives.ops`).
        updater: ``fn(key, received, stored)`` run on the servers (see :meth:`KVStore.set_updater`).
        timeout: seconds a server waits for a missing worker before failing the
            wait with :class:`~collectives.KVStoreTimeout` naming it; the communicator's by default.
        collective: in ``sync`` mode over colocated servers, run push, pull and
            pushpull as collectives over every worker (see docs/kvstore.md and
            :class:`~collectives.kvstore.collective.Rounds`): every worker makes the
            same calls in the same order, and none closes while the others go on.
            ``False`` sends messages to the servers, as every other mode (and
            ``rows=``) does, for workers that push and pull at will.
        reproducible: with ``op`` ``sum`` or ``avg``, float pushes are summed
            reproducibly (:class:`~collectives.ReproducibleSum`): a ``sync`` round's
            aggregate, by messages or by collectives, and the value ``async`` and
            ``ssp`` keep under the default updater (the initial value plus every push),
            have bits that depend only on the pushes, not on the order they arrive in,
            nor on which worker sent which. Sparse rows are combined as without it.

    Raises:
        ConfigurationError: an unknown mode, a negative staleness, too many servers,
            or an MPI without ``THREAD_MULTIPLE`` for colocated servers.
    """
    if mode not in MODES:
        raise ConfigurationError(f"unknown mode {mode!r}; the modes are {', '.join(MODES)}")
    if isinstance(staleness, bool) or not isinstance(staleness, int) or staleness < 0:
        raise ConfigurationError(f"staleness must be an int >= 0, got {staleness!r}")
    if staleness and mode != "ssp":
        raise ConfigurationError(f"staleness={staleness} applies to mode 'ssp', not {mode!r}")
    reduce_op = get_op(op)
    if reproducible and reduce_op.name not in ("sum", "avg"):
        raise ConfigurationError(f"reproducible=True sums: op must be 'sum' or 'avg', not {reduce_op.name!r}")
    channel = open_channel(comm, timeout)
    try:
        roles = Roles(channel.size, servers or 0)
        if not roles.dedicated and channel.transport.thread_level != "multiple":
            raise ConfigurationError(
                f"colocated servers need MPI_THREAD_MULTIPLE, MPI gives {channel.transport.thread_level!r}; "
                "use servers=k dedicated server ranks, or initialise MPI with threads"
            )
        if channel.owned:  # a duplicate made now, collectively: MPI may give it a freed store's context
            number_store(channel)
    except BaseException:
        channel.close()
        raise
    server = None
    if roles.is_server(channel.rank):
        server = Server(channel, mode, staleness, roles.worker_ranks, reduce_op, reproducible)
        server.updater = updater
    store = KVStore(channel, roles, mode, staleness, reduce_op, partition_bytes, collective, server=server)
    if server is not None and not roles.is_worker(channel.rank):  # a dedicated server serves until the end
        try:
            server.serve()
        finally:
            channel.close()
    return store
