"""``sync`` push, pull and pushpull over colocated servers as collectives: reduce, update, gather."""

__all__ = ["WHOLE_BYTES", "Plan", "Rounds", "key_tag"]

import hashlib
import itertools
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from ..errors import CollectiveTimeout, KeyMismatchError, KVStoreError, KVStoreTimeout, MismatchError
from ..ops import ReduceOp
from ._adapter import Channel
from ._wire import key_bytes
from .handles import KeyInfo, Pulled, checked_value
from .layout import Partition
from .server import Server

WHOLE_BYTES = 1 << 20
"""Where the servers assign a round's aggregate, a push of at most this many bytes is one allreduce
(one call's latency) whose whole result a pull then copies; a larger push is a reduce-scatter and its
pull an all-gather straight into ``out`` (no copy of the whole value)."""

_CODES = {"push": b"P", "pull": b"G", "pushpull": b"B"}
_DONE = {b"P"[0]: "pushed", b"G"[0]: "pulled", b"B"[0]: "pushpulled"}
_TYPES = {b"i"[0]: "int", b"s"[0]: "str"}


def key_tag(key: Any, what: str) -> bytes:
    """The signature tag of the store's collectives for ``what`` (push, pull, pushpull) of ``key``.

    Six bytes of the key's digest, its type and the operation: calls of different
    keys, of 3 and "3", or a push against a pull, disagree in the watchdog's
    signature exchange, which every collective makes anyway.
    """
    raw = key_bytes(key)
    return hashlib.blake2b(raw, digest_size=6).digest() + raw[:1] + _CODES[what]


class Plan:
    """A key's ``pushpull`` as one allreduce, checked once and kept (see :meth:`Rounds.pushpull_one`).

    Built at a key's first such pushpull where the servers assign the round's
    aggregate (no updater or optimizer); :meth:`Rounds.forget` drops every plan
    when that changes.
    """

    __slots__ = ("dtype", "flat", "held", "meta", "push_tag", "raw", "shape", "tag")

    def __init__(self, key: Any, meta: KeyInfo, rank: int) -> None:
        self.meta = meta
        self.shape = meta.shape
        self.dtype = meta.dtype
        self.flat = len(meta.shape) == 1  # the aggregate is the servers' flat value as it is
        self.raw = key_bytes(key)
        self.tag = key_tag(key, "pushpull")
        self.push_tag = key_tag(key, "push")
        self.held = [p for p in meta.parts if p.server == rank]


def _in_rank_order(parts: tuple[Partition, ...]) -> bool:
    return all(a.server <= b.server for a, b in itertools.pairwise(parts))


_numbers_lock = threading.Lock()
_last_number = 0  # the highest store number this process has taken part in


def number_store(channel: Channel) -> None:
    """Give the store a number no earlier store of this process had, the same on every rank; collective.

    Each rank offers one more than the highest it has seen and all take the
    largest, so that no message of an earlier store on a reused MPI context (or on
    the same loopback communicator) is taken as this store's (see ``Channel.store``).
    """
    global _last_number
    from .. import api

    with _numbers_lock:
        offer = _last_number + 1
    agreed = api.allreduce(np.array([offer], np.int64), "max", comm=channel.comm)
    number = int(agreed[0]) % (1 << 31)
    with _numbers_lock:
        _last_number = max(_last_number, int(agreed[0]))
    channel.store = number


class Rounds:
    """A store's ``sync`` rounds over colocated servers, run as collectives over every worker (all ranks).

    Every worker calls :meth:`push`, :meth:`pull` and :meth:`pushpull` for the
    same keys in the same order. Where the servers keep a round's aggregate as it
    is (no updater or optimizer) and the value is small (:data:`WHOLE_BYTES`), a
    push is one allreduce, after which each server stores its partitions and the
    worker keeps the whole result at hand for the pull that follows (which then
    sends nothing). Otherwise, where the
    partitions lie in runs in rank order (a value cut into at least as many
    partitions as servers, or one partition), a push is a reduce-scatter whose
    shares the servers update, and a pull an all-gather of the servers' runs;
    partitions out of rank order go one by one, a reduce to their server and a
    broadcast from it. The collectives combine in a fixed order, so the result
    has the same bits on every rank and every run.
    """

    def __init__(self, channel: Channel, server: Server, op: ReduceOp) -> None:
        self._channel = channel
        self._server = server
        self._op = op
        self._reproducible = server.reproducible  # every reduction's sum then has the multiset's bits
        # per raw key: the last push's result buffer (the whole value, or this server's updated run),
        # kept for the next push; in _fresh while it is this round's, mapped to whether it is the whole
        self._buffers: dict[bytes, np.ndarray] = {}
        self._fresh: dict[bytes, bool] = {}
        self._plans: dict[Any, Plan] = {}  # per key: its pushpull as one allreduce, checked once
        from .. import api

        self._allreduce = api.allreduce  # looked up once: api is imported lazily (it imports the package)
        self._comm = channel.comm

    def push_keys(self, items: list[tuple[Any, KeyInfo, Any]]) -> None:
        """:meth:`push` each (key, its info, value), every value checked before any round runs."""
        rank = self._channel.rank
        flats = [checked_value(k, meta, v, rank) for k, meta, v in items]
        for (k, meta, _), flat in zip(items, flats, strict=True):
            self.push(k, meta.parts, flat)
            meta.pushes += 1

    def pull_keys(self, items: list[tuple[Any, KeyInfo, Any]], report: bool) -> list[Any]:
        """:meth:`pull` each (key, its info, out or ``None``): values, or :class:`Pulled` with ``report``."""
        got: list[Any] = []
        for k, meta, out in items:
            flat = None if out is None else checked_value(k, meta, out, self._channel.rank, out=True)
            pulled = self.pull(k, meta.parts, flat, meta.dtype, meta.pushes)
            value = pulled.reshape(meta.shape) if out is None else out
            got.append(Pulled(value, (meta.pushes,) * len(meta.parts)) if report else value)
        return got

    def pushpull_keys(self, items: list[tuple[Any, KeyInfo, Any, Any]]) -> list[np.ndarray]:
        """:meth:`pushpull` each (key, its info, value, out or ``None``), every value checked first."""
        rank = self._channel.rank
        rounds, results = [], []
        for k, meta, value, out in items:
            target = np.empty(meta.shape, meta.dtype) if out is None else out
            flat, flat_target = (
                checked_value(k, meta, value, rank),
                checked_value(k, meta, target, rank, out=True),
            )
            rounds.append((k, meta, flat, flat_target))
            results.append(target)
        for k, meta, flat, flat_target in rounds:
            self.pushpull(k, meta.parts, flat, flat_target)
            meta.pushes += 1
        return results

    def _plan(self, key: Any, value: Any, keys: dict[Any, KeyInfo]) -> Plan | None:
        """The key's kept :class:`Plan` where ``value`` fits it exactly, else ``None``."""
        if key.__class__ is not str and key.__class__ is not int:  # not a bool, an int subclass or a list
            return None
        plan = self._plans.get(key)
        if plan is None:
            meta = keys.get(key)
            if meta is None or not self._server.assigns:
                return None
            plan = self._plans[key] = Plan(key, meta, self._channel.rank)
        if (
            value.__class__ is not np.ndarray
            or value.shape != plan.shape
            or (value.dtype is not plan.dtype and value.dtype != plan.dtype)
            or not value.flags.c_contiguous
        ):
            return None
        return plan

    def _planned(
        self, plan: Plan, key: Any, what: str, tag: bytes, value: np.ndarray, target: np.ndarray
    ) -> None:
        """The plan's allreduce of ``value`` into ``target``, tagged; the servers assign the result."""
        tag_calls = self._channel.tag_calls
        tag_calls(tag)
        try:
            self._allreduce(
                value, self._op, out=target, comm=self._comm, check=True, reproducible=self._reproducible
            )
        except (MismatchError, CollectiveTimeout) as error:
            failure = _failure(error, key, what, tag, self._channel.rank)
            if failure is error:
                raise
            raise failure from error
        finally:
            tag_calls(b"")
        self._server.assign_round(plan.raw, plan.held, target if plan.flat else target.reshape(-1))
        plan.meta.pushes += 1

    def push_one(self, key: Any, value: Any, keys: dict[Any, KeyInfo]) -> bool:
        """``push`` of one key as one allreduce, by its kept :class:`Plan`; ``False`` where none fits.

        As :meth:`push` of a value of at most :data:`WHOLE_BYTES` where the servers
        assign: the whole result stays at hand for the pull that follows. Where the
        plan does not fit (see :meth:`pushpull_one`) nothing is sent.
        """
        plan = self._plan(key, value, keys)
        if plan is None or value.nbytes > WHOLE_BYTES:
            return False
        raw = plan.raw
        self._fresh.pop(raw, None)
        result = self._buffer(raw, value.size, plan.dtype)
        self._planned(plan, key, "push", plan.push_tag, value if plan.flat else value.reshape(-1), result)
        self._fresh[raw] = True
        return True

    def pushpull_one(self, key: Any, value: Any, out: Any, keys: dict[Any, KeyInfo]) -> np.ndarray | None:
        """``pushpull`` of one key as one allreduce, by its kept :class:`Plan`; ``None`` where none fits.

        ``keys`` are the worker's (its key's :class:`KeyInfo` makes the plan). Where
        the key is not a plain int or str, unknown, or the servers do not assign, or
        where the value or ``out`` is not an array of the key's exact shape and dtype
        (C-contiguous), this returns ``None`` before anything is sent: the general
        path checks, converts or names the problem. The key travels in the allreduce's
        signature tag, so a worker out of order still gets :class:`KeyMismatchError`.
        """
        plan = self._plan(key, value, keys)
        if plan is None:
            return None
        shape, dtype = plan.shape, plan.dtype
        if out is None:
            target = np.empty(shape, dtype)
        elif (
            out.__class__ is np.ndarray
            and out.shape == shape
            and (out.dtype is dtype or out.dtype == dtype)
            and out.flags.c_contiguous
        ):
            target = out
        else:
            return None
        if self._fresh:
            self._fresh.pop(plan.raw, None)
        self._planned(plan, key, "pushpull", plan.tag, value, target)
        return target

    def forget(self) -> None:
        """Drop every kept :class:`Plan` (the servers' updater or optimizer changed)."""
        self._plans.clear()

    def push(self, key: Any, parts: tuple[Partition, ...], value: np.ndarray) -> None:
        """This worker's round of ``key``: ``value`` (flat) combined with every worker's, updated."""
        raw = key_bytes(key)
        rank = self._channel.rank
        self._fresh.pop(raw, None)
        whole = self._server.assigns and value.nbytes <= WHOLE_BYTES
        with self._calls(key, "push"):
            if whole:
                self._reduced_round(raw, parts, value, self._buffer(raw, value.size, value.dtype))
            elif _in_rank_order(parts):
                counts, held, start = self._runs(parts)
                share = self._buffer(raw, counts[rank], value.dtype)
                self._reduced_round(raw, held, value, share, counts=counts, start=start)
            else:
                for p in parts:
                    piece = np.empty(p.hi - p.lo, value.dtype)
                    self._reduced_round(raw, [p], value[p.lo : p.hi], piece, root=p.server, start=p.lo)
                return  # a pull broadcasts the stored partitions
        self._fresh[raw] = whole

    def _reduced_round(
        self,
        raw: bytes,
        parts: Sequence[Partition],
        value: np.ndarray,
        out: np.ndarray,
        *,
        counts: Sequence[int] | None = None,
        root: int | None = None,
        start: int = 0,
    ) -> None:
        """A round's aggregate of ``value`` into ``out``, and the servers' update of it.

        By an allreduce, each server keeping its ``parts``; with ``counts``, this
        rank's run (from element ``start``) by a reduce-scatter, ``parts`` its
        partitions; with ``root``, one partition's (``parts``) by a reduce to its server.
        """
        from .. import api

        op, rank = self._op, self._channel.rank
        options: dict[str, Any] = {"out": out, "comm": self._channel.comm, "check": True}
        options["reproducible"] = self._reproducible
        held = list(parts)
        if counts is not None:
            api.reduce_scatter(value, op, counts=counts, **options)
        elif root is not None:
            api.reduce(value, op, root=root, **options)
            if rank != root:
                return
        else:
            api.allreduce(value, op, **options)
            held = [p for p in parts if p.server == rank]
        self._server.apply_round(raw, held, out, start)

    def pull(
        self,
        key: Any,
        parts: tuple[Partition, ...],
        target: np.ndarray | None,
        dtype: np.dtype[Any],
        rounds: int,
    ) -> np.ndarray:
        """The value of ``key`` (flat) into ``target`` or a new array, after its first ``rounds`` rounds."""
        from .. import api

        raw = key_bytes(key)
        comm, rank = self._channel.comm, self._channel.rank
        fresh = self._fresh.pop(raw, None)
        if fresh:  # the push's allreduce left the whole value here
            whole = self._buffers[raw]
            if target is None:
                del self._buffers[raw]  # the caller's now
                return whole
            target[...] = whole
            return target
        result = np.empty(max((p.hi for p in parts), default=0), dtype) if target is None else target
        with self._calls(key, "pull"):
            if _in_rank_order(parts):
                counts, held, start = self._runs(parts)
                if fresh is False:  # the push's reduce-scatter left this server's updated run here
                    share = self._buffers[raw]
                else:
                    share = self._stored(key, held, start, counts[rank], dtype, rounds)
                api.allgather(share, counts=counts, out=result, comm=comm, check=True)
                return result
            for p in parts:
                piece = result[p.lo : p.hi]
                if rank == p.server:
                    piece[...] = self._stored(key, [p], p.lo, p.hi - p.lo, dtype, rounds)
                api.broadcast(piece, root=p.server, out=piece, comm=comm, check=True)
        return result

    def pushpull(self, key: Any, parts: tuple[Partition, ...], value: np.ndarray, target: np.ndarray) -> None:
        """:meth:`push` then :meth:`pull` as one: the updated runs come back by the all-gather at once."""
        from .. import api

        raw = key_bytes(key)
        comm, rank = self._channel.comm, self._channel.rank
        self._fresh.pop(raw, None)
        with self._calls(key, "pushpull"):
            if self._server.assigns:
                # the stored value simply becomes the aggregate: one allreduce, and each server keeps its part
                self._reduced_round(raw, parts, value, target)
            elif _in_rank_order(parts):
                counts, held, start = self._runs(parts)
                share = target[start : start + counts[rank]]  # reduced, updated and gathered in place
                self._reduced_round(raw, held, value, share, counts=counts, start=start)
                api.allgather(share, counts=counts, out=target, comm=comm, check=True)
            else:
                for p in parts:
                    piece = target[p.lo : p.hi]
                    self._reduced_round(raw, [p], value[p.lo : p.hi], piece, root=p.server, start=p.lo)
                    api.broadcast(piece, root=p.server, out=piece, comm=comm, check=True)

    def _buffer(self, raw: bytes, count: int, dtype: np.dtype[Any]) -> np.ndarray:
        """The key's result buffer of ``count`` elements, reused from its last push where it fits."""
        buffer = self._buffers.get(raw)
        if buffer is None or buffer.size != count or buffer.dtype != dtype:
            buffer = self._buffers[raw] = np.empty(count, dtype)
        return buffer

    def _runs(self, parts: tuple[Partition, ...]) -> tuple[list[int], list[Partition], int]:
        """Each server's elements of the key, the partitions this rank's server holds, where they start."""
        counts = [0] * self._channel.size
        for p in parts:
            counts[p.server] += p.hi - p.lo
        held = [p for p in parts if p.server == self._channel.rank]
        return counts, held, held[0].lo if held else 0

    def _stored(
        self, key: Any, held: list[Partition], start: int, count: int, dtype: np.dtype[Any], rounds: int
    ) -> np.ndarray:
        """This server's partitions ``held`` of ``key`` after ``rounds`` rounds, as one run from ``start``.

        A round pushed by messages (``rows=``) completes on the server thread: wait for it.
        """
        raw, server = key_bytes(key), self._server
        deadline = time.monotonic() + self._channel.timeout
        pause = 1e-5
        while True:
            with server.lock:
                stored = [server.parts[(raw, p.index)] for p in held]
                if all(part.round >= rounds for part in stored):
                    run = np.empty(count, dtype)
                    for p, part in zip(held, stored, strict=True):
                        run[p.lo - start : p.hi - start] = part.value
                    return run
            if server.broken is not None:  # the round will not come
                raise KVStoreError(server.broken)
            if time.monotonic() > deadline:
                raise KVStoreTimeout(
                    f"pull of key {key!r} on rank {self._channel.rank}: its server waited "
                    f"{self._channel.timeout:g} s for round {rounds - 1}",
                    key=key,
                )
            time.sleep(pause)
            pause = min(2 * pause, 1e-3)

    @contextmanager
    def _calls(self, key: Any, what: str) -> Iterator[None]:
        """The store's collectives of ``what`` for ``key``, tagged with it; their errors named."""
        channel = self._channel
        mine = key_tag(key, what)
        channel.tag_calls(mine)
        try:
            yield
        except (MismatchError, CollectiveTimeout) as error:
            failure = _failure(error, key, what, mine, channel.rank)
            if failure is error:
                raise
            raise failure from error
        finally:
            channel.tag_calls(b"")


def _failure(error: Exception, key: Any, what: str, mine: bytes, rank: int) -> Exception:
    """The error to raise for the store's failed collective (``what`` of ``key``): named where it can be."""
    if isinstance(error, MismatchError):
        return _named(error, key, what, mine, rank) or error
    if isinstance(error, KVStoreTimeout) or not isinstance(error, CollectiveTimeout):
        return error
    return KVStoreTimeout(
        f"{what} of key {key!r} on rank {rank}: workers {list(error.peers)} did not take "
        f"part within the timeout ({error})",
        key=key,
        workers=error.peers,
    )


def _named(error: MismatchError, key: Any, what: str, mine: bytes, rank: int) -> KeyMismatchError | None:
    """The error naming the key and the workers whose call differs, where the tags tell; else ``None``."""
    tags = error.fields.get("tag")
    if not tags:
        return None
    clauses = []
    for text, ranks in tags.items():
        if text == mine.hex():
            continue
        theirs = bytes.fromhex(text) if text != "none" else b""
        if len(theirs) < len(mine):
            clauses.append(f"workers {list(ranks)} called a collective outside the store")
        elif theirs[:7] == mine[:7]:
            clauses.append(f"workers {list(ranks)} {_DONE.get(theirs[7], '?')} it")
        else:
            kind = _TYPES.get(theirs[6], "?")
            clauses.append(f"workers {list(ranks)} {_DONE.get(theirs[7], '?')} another key (of type {kind})")
    return KeyMismatchError(
        f"{what} of key {key!r} ({type(key).__name__}) on rank {rank}: {'; '.join(clauses)} in the same "
        "round; with collective rounds every worker pushes and pulls the same keys in the same order"
    )
