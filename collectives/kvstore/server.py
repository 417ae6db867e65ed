"""A server of the store: holds partitions, applies pushes by the consistency mode, answers pulls."""

__all__ = ["Server", "take_parts"]

import json
import math
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from ..errors import KVStoreError
from ..ops import ReduceOp
from ._adapter import Channel
from ._wire import (
    BUNDLE_BYTES,
    QUIET,
    REPLY_TAG,
    REQUEST_TAG,
    Kind,
    Message,
    Refusal,
    bundle,
    compose,
    parse_key,
    unbundle,
)
from .checkpoint import read_manifest, restore_shards, write_shard
from .updaters import (
    Optimizer,
    Updater,
    accumulate,
    assign,
    combine_pushes,
    combine_rows,
    optimizer_from_spec,
)

_IDLE_WAKE_S = 0.05  # a server with nothing to do still wakes this often, to expire waits and finish sends
_HOT_S = 1e-3  # after a request the thread polls without sleeping this long: requests come in bursts
_FIRST_PAUSE_S = 1e-5
_PAUSE_S = 5e-4  # the longest sleep between probes: a request waits at most this long unseen


@dataclass
class _Part:
    """One partition a server holds."""

    value: np.ndarray  # flat
    shape: str  # the key's dtype and shape as the workers described it, to check later inits against
    round: int = 0  # sync: rounds aggregated; async and ssp: pushes applied
    # sync: round -> worker -> its push: the partition's elements, or (row indices, those rows)
    pending: dict[int, dict[int, "np.ndarray | _Rows"]] = field(default_factory=dict)

    @property
    def row(self) -> int:
        """Elements of a row of the key (see :attr:`shape`), which a partition never splits."""
        dims = [int(d) for d in self.shape.split("|")[1].split(",") if d]
        return max(1, math.prod(dims[1:])) if len(dims) > 1 else 1

    def rows(self) -> np.ndarray:
        return self.value.reshape(-1, self.row)


_Rows = tuple[np.ndarray, np.ndarray]
"""A sparse push: row indices within the partition, and those rows (2-D)."""


@dataclass
class _Wait:
    """A request the server answers once ``ready()``, or with an error at ``deadline``."""

    message: Message
    ready: Callable[[], bool]
    answer: Callable[[], None]
    expire: Callable[[], tuple[str, tuple[int, ...]]]  # the error, and the workers waited for
    deadline: float


class Server:
    """The partitions of one server rank and the loop that serves them.

    Args:
        channel: the store's channel.
        mode: ``"sync"``, ``"async"`` or ``"ssp"``.
        staleness: ``ssp``'s bound.
        workers: the ranks of the workers.
        op: the reducer of a sync round's pushes, and of async/ssp's default updater.
        reproducible: float sums whose bits do not depend on the pushes' order (see ``create``).
    """

    def __init__(
        self, channel: Channel, mode: str, staleness: int, workers: tuple[int, ...], op: ReduceOp,
        reproducible: bool = False,
    ) -> None:  # fmt: skip
        self.channel = channel
        self.reproducible = reproducible
        self.rank = channel.rank
        self.mode = mode
        self.staleness = staleness
        self.op = op
        self.open = set(workers)
        self.workers = workers
        self.parts: dict[tuple[Any, int], _Part] = {}
        self.clocks = dict.fromkeys(workers, 0)  # ssp: clocks each worker has finished
        self.updater: Updater | None = None  # the user's, or None for the mode's default
        self.optimizer: Optimizer | None = None
        self.waits: list[_Wait] = []
        self.barriers: dict[int, list[Message]] = {}  # the workers waiting in each barrier
        self.uses: dict[bytes, Counter[int]] = {}  # each worker's requests per key, to name mix-ups
        self.default_update = assign if mode == "sync" else accumulate(op, reproducible)  # once, not per push
        self.stopping = threading.Event()
        self.lock = threading.Lock()  # the worker's collective pushpull updates partitions too
        self.error: BaseException | None = None
        self.broken: str | None = None  # why the store is broken (Kind.BREAK), if it is
        self.outbox: dict[int, list[bytearray | Message]] | None = None  # replies of one take(), by worker
        # where replies to this rank's own worker go: messages without bytes (see _wire.local)
        self.mailbox: deque[Message] | None = None
        self._handlers: dict[Kind, Callable[[Message], None]] = {  # made once, not per message
            Kind.INIT: self._init,
            Kind.PUSH: self._push,
            Kind.PULL: self._pull,
            Kind.CLOCK: self._clock,
            Kind.BARRIER: self._barrier,
            Kind.CLOSE: self._close,
            Kind.OPTIMIZER: self._optimizer,
            Kind.SAVE: self._save,
            Kind.LOAD: self._load,
            Kind.CONFIRM: self._confirm,
            Kind.BREAK: self._break,
        }

    # the loop

    def serve(self) -> None:
        """Serve until every worker has closed the store (or :attr:`stopping` is set).

        How the thread waits (docs/kvstore.md has the measurements): MPI_Probe cannot be
        bounded and MPICH's blocking calls spin on a core, so it probes without
        waiting. Within ``_HOT_S`` of a request it polls, yielding the core between
        probes (a pull tends to follow a push); then it sleeps between probes, a
        little longer each time up to ``_PAUSE_S``, so that an idle server does not
        take a core from its rank's worker. (Resting it on an event while the
        worker, waiting for an answer, takes this rank's requests itself was
        measured slower: the event's wake-ups cost more than the polls they save.)
        """
        try:
            hot = 0.0
            pause = _FIRST_PAUSE_S
            while self.open and not self.stopping.is_set():
                now = time.monotonic()
                wake = min((w.deadline for w in self.waits), default=math.inf)
                took = self.take_next()
                if not took and now >= wake:
                    self.take(None)
                if took:
                    hot, pause = time.monotonic() + _HOT_S, _FIRST_PAUSE_S
                    continue
                if now < hot:
                    os.sched_yield()
                    continue
                time.sleep(max(0.0, min(pause, _IDLE_WAKE_S, wake - now)))
                pause = min(2 * pause, _PAUSE_S)
            self.channel.flush(max(1.0, min(self.channel.timeout, 30.0)))
        except BaseException as error:
            self.error = error
            raise

    @property
    def assigns(self) -> bool:
        """Whether a round's aggregate is stored as it is (``sync``, no updater or optimizer)."""
        return self.mode == "sync" and self.updater is None and self.optimizer is None

    def take(self, message: Message | None) -> None:
        """Handle ``message`` (if any) and answer the waits it made ready; from either thread of the rank.

        The replies it makes to one worker leave together, as one message (a bundle).
        """
        if message is None:
            self.take_all(())
        else:
            self.take_all(unbundle(message) if message.kind == Kind.BATCH else (message,))

    def take_next(self, wait: bool = True) -> bool:
        """Receive a request that has come, if any, and handle it; whether one came.

        Received and handled under one lock: a colocated rank's worker thread takes
        requests too, and a worker's requests must be handled in the order sent (a
        push taken by one thread must not be handled after the close the other took).
        ``wait=False``: none is taken while the other thread holds the lock.
        """
        if not self.lock.acquire(wait):
            return False
        try:
            message = self.channel.take(REQUEST_TAG)
            if message is not None:
                self._take_all(unbundle(message) if message.kind == Kind.BATCH else (message,))
            return message is not None
        finally:
            self.lock.release()

    def take_all(self, messages: Sequence[Message]) -> None:
        """:meth:`take` of ``messages`` in order (a bundle's, or this rank's own worker's)."""
        with self.lock:
            self._take_all(messages)

    def _take_all(self, messages: Sequence[Message]) -> None:
        self.outbox = {}
        try:
            for m in messages:
                self.handle(m)
            self._settle()
        finally:
            outbox, self.outbox = self.outbox, None
            for dst, replies in outbox.items():
                self._send(dst, replies)

    def _send(self, dst: int, replies: list[bytearray | Message]) -> None:
        if not replies:
            return
        if isinstance(replies[0], Message):  # to this rank's own worker (see _reply): no bundle needed
            for reply in replies:
                self._deliver(dst, reply)
        else:
            self._deliver(
                dst, replies[0] if len(replies) == 1 else bundle(self.rank, cast(list[bytearray], replies))
            )

    def _deliver(self, dst: int, reply: bytearray | Message) -> None:
        if isinstance(reply, Message):  # this rank's worker: no MPI, no bytes
            assert self.mailbox is not None
            self.mailbox.append(reply)
        else:
            self.channel.send(reply, dst, REPLY_TAG)

    def _post(self, reply: bytearray | Message, dst: int) -> None:
        if self.outbox is None:  # outside take (a collective round's waits): at once
            self._deliver(dst, reply)
        elif isinstance(reply, bytearray) and len(reply) > BUNDLE_BYTES:  # alone, after the replies before it
            self._send(dst, self.outbox.pop(dst, []))
            self._deliver(dst, reply)
        else:
            self.outbox.setdefault(dst, []).append(reply)

    def handle(self, m: Message) -> None:
        handler = self._handlers[m.kind]
        if m.key:
            uses = self.uses.get(m.key)
            if uses is None:  # not setdefault: a Counter made for every request costs a microsecond
                uses = self.uses[m.key] = Counter()
            uses[m.origin] += 1
        try:
            handler(m)
        except Exception as error:  # a bad request fails, not the server
            self._error(m, f"server rank {self.rank} failed on {m.kind.name.lower()}: {error}")

    def _settle(self) -> None:
        """Answer the waits that are ready, and fail those past their deadline."""
        if not self.waits:
            return
        now = time.monotonic()
        left = []
        for wait in self.waits:
            if wait.ready():
                wait.answer()
            elif now >= wait.deadline:
                text, workers = wait.expire()
                mixup = self._mixup(wait.message.key, workers)
                fault = Refusal.MISMATCH if mixup else Refusal.LATE
                self._error(wait.message, text + mixup, fault, workers)
            else:
                left.append(wait)
        self.waits = left

    def _mixup(self, key: bytes, missing: tuple[int, ...]) -> str:
        """Why ``missing`` workers never sent ``key``, where they sent its twin (``3`` for ``"3"``) instead.

        A worker strayed if it sent the twin more requests than ``key``: a wait for it
        then fails as a mismatch, not as a late worker.
        """
        twin = {ord("i"): b"s", ord("s"): b"i"}.get(key[0], b"") + key[1:] if key else b""
        if twin[:1] == b"i" and not twin[1:].lstrip(b"-").isdigit():
            return ""  # "abc" has no int twin
        on_key, on_twin = self.uses.get(key, Counter()), self.uses.get(twin, Counter())
        strayed = tuple(w for w in missing if on_twin[w] > on_key[w])
        if not strayed:
            return ""
        them, theirs = parse_key(key), parse_key(twin)
        return (
            f"; {_workers(strayed)} used key {theirs!r} ({type(theirs).__name__}) instead of "
            f"{them!r} ({type(them).__name__}): they are different keys"
        )

    def _defer(
        self,
        m: Message,
        ready: Callable[[], bool],
        answer: Callable[[], None],
        expire: Callable[[], tuple[str, tuple[int, ...]]],
    ) -> None:
        if ready():
            answer()
        else:
            self.waits.append(_Wait(m, ready, answer, expire, time.monotonic() + self.channel.timeout))

    # replies

    def _reply(
        self, m: Message, kind: Kind, *, stamp: int = 0, aux: int = 0, text: str = "", data: Any = None
    ) -> None:
        if kind == Kind.OK and m.flags & QUIET:  # the worker takes a later reply as its OK
            return
        own = m.origin == self.rank and self.mailbox is not None  # this rank's worker: no bytes
        reply = compose(
            kind, self.rank, in_process=own, part=m.part, req=m.req, stamp=stamp, aux=aux,
            key=m.key, text=text, data=data,
        )  # fmt: skip
        self._post(reply, m.origin)

    def _error(
        self, m: Message, text: str, fault: Refusal = Refusal.OTHER, workers: tuple[int, ...] = ()
    ) -> None:
        self._reply(m, Kind.ERROR, aux=fault, text=text, data=np.array(workers, np.int64))

    def _name(self, m: Message) -> str:
        return self._name_of(m.key, m.part)

    @staticmethod
    def _name_of(key: bytes, index: int) -> str:
        return f"key {parse_key(key)!r} partition {index}"

    # requests

    def _init(self, m: Message) -> None:
        where = (m.key, m.part)
        if m.origin == self.workers[0] and where not in self.parts:
            dtype = m.text.split("|")[0]
            self.parts[where] = _Part(np.frombuffer(m.data, dtype).copy(), m.text)

        def answer() -> None:
            part = self.parts[where]
            if part.shape != m.text:
                self._error(
                    m,
                    f"worker {m.origin} initialised {self._name(m)} as {m.text}; "
                    f"worker {self.workers[0]} as {part.shape}",
                    Refusal.MISMATCH,
                    (m.origin,),
                )
            else:
                self._reply(m, Kind.OK)

        self._defer(
            m,
            lambda: where in self.parts,
            answer,
            lambda: (
                f"server rank {self.rank} waited {self.channel.timeout:g} s for worker "
                f"{self.workers[0]} to initialise {self._name(m)}",
                (self.workers[0],),
            ),
        )

    def _update(self, key: Any, index: int, received: np.ndarray, part: _Part) -> bool:
        """Run the updater on one partition; whether its stored value is now ``received`` itself."""
        if self.optimizer is not None:
            update = self.optimizer.updater(index)
        elif self.updater is not None:
            update = self.updater
        else:
            update = self.default_update
        new = update(key, received, part.value)
        if new is not part.value:
            part.value[...] = np.asarray(new).reshape(-1)
        return update is assign

    def _push(self, m: Message) -> None:
        part = self.parts.get((m.key, m.part))
        if part is None:  # the worker checks first, so only a store out of step gets here
            self._error(m, f"server rank {self.rank} holds no {self._name(m)}")
            return
        received: np.ndarray | _Rows
        if m.aux:  # rows: their indices, then the rows
            ids = np.frombuffer(m.data, np.int64, m.aux - 1)
            values = np.frombuffer(m.data, part.value.dtype, offset=ids.nbytes).reshape(ids.size, part.row)
            received = (ids, values)
        else:
            received = np.frombuffer(m.data, part.value.dtype)
        if self.mode != "sync":
            if isinstance(received, tuple):
                self._update_rows(parse_key(m.key), m.part, received[0], received[1], part)
            else:
                self._update(parse_key(m.key), m.part, received, part)
            part.round += 1
        else:
            copied = (
                (received[0].copy(), received[1].copy()) if isinstance(received, tuple) else received.copy()
            )
            part.pending.setdefault(m.stamp, {})[m.origin] = copied
            self._complete_rounds(m.key, m.part, part)
        self._reply(m, Kind.OK, stamp=part.round)

    def _complete_rounds(self, key: bytes, index: int, part: _Part) -> None:
        """Aggregate each round every open worker has pushed, in worker order, and apply it."""
        while True:
            pushes = part.pending.get(part.round)
            if pushes is None or not self.open <= pushes.keys():
                return
            order = sorted(pushes)
            if any(isinstance(pushes[w], tuple) for w in order):
                del part.pending[part.round]
                ids, values = combine_rows(part.rows(), [pushes[w] for w in order], self.op)
                self._update_rows(parse_key(key), index, ids, values, part)
                part.round += 1
                continue
            total = combine_pushes([cast(np.ndarray, pushes[w]) for w in order], self.op, self.reproducible)
            del part.pending[part.round]
            self._update(parse_key(key), index, total, part)
            part.round += 1

    def apply_round(self, key: bytes, held: list[Any], aggregate: np.ndarray, start: int) -> None:
        """Apply a round aggregated by collectives to the partitions ``held`` here, in place.

        ``aggregate`` holds the partitions' elements from element ``start`` of the
        key on; each partition's new value is written back over its aggregate
        (a copy spared where the stored value simply becomes the aggregate).
        """
        with self.lock:
            for p in held:
                part = self.parts[(key, p.index)]
                if part.pending.get(part.round):
                    raise KVStoreError(
                        f"round {part.round} of {self._name_of(key, p.index)} has pushes by message "
                        f"from workers {sorted(part.pending[part.round])} and a pushpull by collectives; "
                        "in sync mode every worker uses one or the other for a round"
                    )
                received = aggregate[p.lo - start : p.hi - start]
                if not self._update(parse_key(key), p.index, received, part):
                    received[...] = part.value
                part.round += 1
            self._settle()  # pulls waiting for this round

    def assign_round(self, key: bytes, held: list[Any], aggregate: np.ndarray) -> None:
        """:meth:`apply_round` of a whole key's aggregate where the servers assign (see :attr:`assigns`)."""
        with self.lock:
            parts = self.parts
            for p in held:
                if parts[(key, p.index)].pending:  # pushes by message too: apply_round names the mix
                    break
            else:
                for p in held:
                    part = parts[(key, p.index)]
                    part.value[...] = aggregate[p.lo : p.hi]
                    part.round += 1
                if self.waits:
                    self._settle()  # pulls waiting for this round
                return
        self.apply_round(key, held, aggregate, 0)

    def _update_rows(self, key: Any, index: int, ids: np.ndarray, values: np.ndarray, part: _Part) -> None:
        """Run the updater on rows ``ids`` of the partition only."""
        stored = part.rows()
        if self.optimizer is not None:
            self.optimizer.update_rows(key, index, ids, values, stored)
            return
        update = self.updater or self.default_update
        rows = stored[ids]
        new = update(key, np.ascontiguousarray(values).reshape(-1), rows.reshape(-1))
        stored[ids] = np.asarray(new).reshape(rows.shape)

    def _pull(self, m: Message) -> None:
        where = (m.key, m.part)
        part = self.parts.get(where)
        if part is None:
            self._error(m, f"server rank {self.rank} holds no {self._name(m)}")
            return

        def answer() -> None:
            stamp = self._included() if self.mode == "ssp" else part.round
            rows = np.frombuffer(m.data, np.int64, m.aux - 1) if m.aux else None  # only these rows
            data = part.value if rows is None else part.rows()[rows]
            self._reply(m, Kind.DATA, stamp=stamp, data=data)

        if self.mode == "sync":
            # a pull after the worker's round need-1 push waits for that round's aggregate
            self._defer(m, lambda: part.round >= m.stamp, answer, lambda: self._late_round(m, part))
        elif self.mode == "ssp":
            # a pull at clock c includes every worker's pushes of clocks <= c - s - 1
            need = m.stamp - self.staleness
            self._defer(m, lambda: self._included() + 1 >= need, answer, lambda: self._late_clock(m, need))
        else:
            answer()

    def _included(self) -> int:
        """The last clock whose pushes from every open worker have all arrived (-1 for none)."""
        if not self.open:
            return max(self.clocks.values()) - 1
        return min(self.clocks[w] for w in self.open) - 1

    def _late_round(self, m: Message, part: _Part) -> tuple[str, tuple[int, ...]]:
        missing = tuple(sorted(self.open - part.pending.get(part.round, {}).keys()))
        return (
            f"server rank {self.rank} waited {self.channel.timeout:g} s for round {part.round} of "
            f"{self._name(m)}: no push from {_workers(missing)}",
            missing,
        )

    def _late_clock(self, m: Message, need: int) -> tuple[str, tuple[int, ...]]:
        missing = tuple(sorted(w for w in self.open if self.clocks[w] < need))
        clocks = ", ".join(str(self.clocks[w]) for w in missing)
        return (
            f"server rank {self.rank} waited {self.channel.timeout:g} s for clock {need - 1} of "
            f"{self._name(m)}: {_workers(missing)} at clock {clocks}",
            missing,
        )

    def _confirm(self, m: Message) -> None:
        self._reply(m, Kind.OK)  # sent after every earlier request of the worker's was handled

    def _clock(self, m: Message) -> None:
        self.clocks[m.origin] = m.stamp
        self._reply(m, Kind.OK)

    def _barrier(self, m: Message) -> None:
        waiting = self.barriers.setdefault(m.stamp, [])
        waiting.append(m)

        def ready() -> bool:
            return self.open <= {x.origin for x in waiting}

        def answer() -> None:  # the first ready answers every worker; the others find it done
            if self.barriers.pop(m.stamp, None) is not None:
                flag = int(any(x.aux for x in waiting))  # a worker's failure, told to all
                for x in waiting:
                    self._reply(x, Kind.OK, aux=flag)

        def expire() -> tuple[str, tuple[int, ...]]:
            self.barriers.pop(m.stamp, None)
            missing = tuple(sorted(self.open - {x.origin for x in waiting}))
            text = f"barrier {m.stamp}: server rank {self.rank} waited {self.channel.timeout:g} s for "
            return text + _workers(missing), missing

        self._defer(m, ready, answer, expire)

    def _close(self, m: Message) -> None:
        self.open.discard(m.origin)
        if self.mode == "sync":
            for (key, index), part in self.parts.items():
                self._complete_rounds(key, index, part)
        self._reply(m, Kind.OK)

    def _break(self, m: Message) -> None:
        """A worker's call was interrupted: fail every wait, and refuse every request but a close from now on.

        The handlers are swapped rather than each checking, so that serving costs nothing more.
        """
        if self.broken is None:
            self.broken = m.text
            refuse: Callable[[Message], None] = self._refuse
            self._handlers = dict.fromkeys(self._handlers, refuse) | {
                Kind.CLOSE: self._leave,
                Kind.BREAK: self._break,
            }
            waits, self.waits = self.waits, []
            self.barriers.clear()
            for wait in waits:
                self._refuse(wait.message)
            # every other worker is told too: a request of its that this rank's worker thread was
            # handling when interrupted will get no answer
            for worker in self.open - {m.origin}:
                own = worker == self.rank and self.mailbox is not None  # this rank's worker: no bytes
                told = compose(Kind.ERROR, self.rank, in_process=own, aux=Refusal.BROKEN, text=self.broken)
                self._post(told, worker)
        self._reply(m, Kind.OK)

    def _refuse(self, m: Message) -> None:
        self._error(m, self.broken or "", Refusal.BROKEN)

    def _leave(self, m: Message) -> None:
        """A close on a broken store: no round completes without the worker."""
        self.open.discard(m.origin)
        self._reply(m, Kind.OK)

    def _save(self, m: Message) -> None:
        request = json.loads(m.text)
        try:
            write_shard(self.parts, self.optimizer, Path(request["dir"]), request["index"], request["id"])
        except OSError as error:
            self._error(m, f"server rank {self.rank} could not write its shard: {error}")
            return
        self._reply(m, Kind.OK)

    def _load(self, m: Message) -> None:
        try:
            _restore(self, json.loads(m.text))
        except (KVStoreError, OSError, ValueError, KeyError) as error:
            self._error(m, str(error))
            return
        self._reply(m, Kind.OK)

    def _optimizer(self, m: Message) -> None:
        if m.origin == self.workers[0]:
            try:
                self.optimizer = optimizer_from_spec(m.text)
            except Exception as error:
                self._error(m, str(error))
                return
        self._reply(m, Kind.OK)


def _workers(ranks: tuple[int, ...]) -> str:
    return f"worker{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _restore(server: Server, request: dict[str, Any]) -> None:
    """Take the partitions ``request`` assigns this server from the checkpoint it names."""
    directory = Path(request["dir"])
    manifest = read_manifest(directory)
    if server.parts:
        raise KVStoreError(f"server rank {server.rank} holds keys already; load into a new store")
    saved = restore_shards(directory, manifest)
    optimizer = None if manifest["optimizer"] is None else optimizer_from_spec(manifest["optimizer"])
    take_parts(server, saved, optimizer, int(manifest["clock"]), request["parts"])


def take_parts(
    server: Server,
    saved: dict[bytes, dict[str, Any]],
    optimizer: Optimizer | None,
    clock: int,
    parts: list[tuple[str, int, int, int]],
) -> None:
    """Hold ``parts`` (key, index, lo, hi) of the whole keys ``saved`` (as ``restore_shards`` gives them)."""
    for text, index, lo, hi in parts:
        raw = text.encode()
        whole = saved[raw]
        server.parts[(raw, index)] = _Part(whole["value"][lo:hi].copy(), whole["shape"], whole["round"])
        if optimizer is not None and (whole["state"] or whole["scalars"]):
            state = {name: array[lo:hi].copy() for name, array in whole["state"].items()}
            optimizer.load_partition_state(parse_key(raw), index, {**state, **whole["scalars"]})
    server.optimizer = optimizer
    server.clocks = dict.fromkeys(server.workers, clock)
