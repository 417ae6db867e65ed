"""Collectives matched across ranks by name, as Horovod matches them, whatever order each rank starts them in.

Each rank keeps the named collectives it has started and not yet run. A start
queues a *drive* on the communicator's thread, unless one is queued; a drive that finds
something pending runs rounds until nothing is pending on any rank. A round
is one small allgather of each rank's pending names (a count and a digest;
the names themselves only where the ranks differ); the collectives pending on
every rank then run, in rank 0's order, on every rank alike. A drive that
finds nothing pending returns without a message, so every rank runs the same
rounds: each name pending on one rank is pending on the others by the time
they start it. Where no collective can run for the communicator's timeout (a
name no other rank ever starts), every pending one fails with
:class:`~collectives.MismatchError` on every rank.
"""

__all__ = ["NamedOps", "named_ops"]

import hashlib
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np

from .. import api
from ..errors import CollectivesError, MismatchError
from ..tracing.torch_ranges import ranged
from .worker import background_worker

T = TypeVar("T")

_MOST_IDLE_S = 0.02  # the longest pause between rounds in which nothing could run


def _key(text: str) -> int:
    """A 63-bit digest of ``text``, the same in every process."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


class _Op:
    __slots__ = ("future", "job", "key", "name")

    def __init__(self, name: str, job: Callable[[api.Communicator], Any]) -> None:
        self.name = name
        self.key = _key(name)
        self.job = job
        self.future: Future[Any] = Future()


class NamedOps:
    """The named collectives of one communicator: started in any order, run once every rank started them."""

    def __init__(self, communicator: api.Communicator) -> None:
        self._worker = background_worker(communicator)
        self._lock = threading.Lock()
        self._pending: dict[str, _Op] = {}
        self._drive_queued = False  # a drive is on the worker's queue and has not looked at _pending yet
        self.rounds = 0  # rounds run so far (for tests and the curious)

    def submit(self, name: str, job: Callable[[api.Communicator], T]) -> "Future[T]":
        """Start the collective ``job`` under ``name``; the future holds its result once it ran.

        Raises:
            ValueError: a collective of that name is already pending on this rank.
        """
        with self._lock:
            if name in self._pending:
                raise ValueError(
                    f"a collective named {name!r} is already in flight on this rank; "
                    "wait for it before starting another of that name"
                )
            op = _Op(name, job)
            self._pending[name] = op
            queued, self._drive_queued = self._drive_queued, True
        if not queued:  # a drive queued and not yet started will find this one too
            self._worker.submit(self._drive)
        return op.future

    def pending(self) -> list[str]:
        """The names started on this rank and not yet run, in the order they were started."""
        with self._lock:
            return list(self._pending)

    def _drive(self) -> None:
        """Run rounds until nothing is pending on any rank; nothing at all if nothing is pending here."""
        with self._lock:
            self._drive_queued = False
            if not self._pending:
                return
        communicator = self._worker.communicator
        pause = 0.0
        progress = time.monotonic()
        try:
            while True:
                stalled = time.monotonic() - progress > communicator.timeout
                ready, done = self._round(communicator, stalled)
                for op in ready:
                    _run(op, communicator)
                if done:
                    return
                if ready:
                    progress, pause = time.monotonic(), 0.0
                else:  # another rank has not started these yet
                    time.sleep(pause)
                    pause = min(_MOST_IDLE_S, pause * 2 or 0.0005)
        except BaseException as error:
            # the rounds themselves failed (a timeout, a peer gone, a stall): every pending collective fails
            with self._lock:
                failed, self._pending = list(self._pending.values()), {}
            for op in failed:
                op.future.set_exception(
                    error
                    if isinstance(error, MismatchError)
                    else CollectivesError(
                        f"{op.name}: matching collectives by name across ranks failed: {error}"
                    )
                )

    def _round(self, communicator: api.Communicator, stalled: bool) -> tuple[list[_Op], bool]:
        """One round: the collectives pending on every rank, to run now, and whether that is all of them.

        Raises:
            MismatchError: on every rank, once a rank saw no collective run for the
                communicator's timeout (the ranks wait for names the others never start).
        """
        self.rounds += 1
        with self._lock:
            mine = list(self._pending.values())
        keys = np.array([op.key for op in mine], np.int64)
        digest = int.from_bytes(hashlib.blake2b(keys.tobytes(), digest_size=8).digest(), "little") >> 1
        summary = np.array([len(mine), digest, int(stalled)], np.int64)
        every = np.asarray(api.allgather(summary, comm=communicator)).reshape(-1, 3)
        if every[:, 2].any():
            pending: dict[str, tuple[int, ...]] = {f"rank {r}": (int(n),) for r, n in enumerate(every[:, 0])}
            raise MismatchError(
                f"no named collective could run for {communicator.timeout:g} s: the ranks wait for names "
                f"the others have not started; pending here: {[op.name for op in mine][:8]}",
                {"pending collectives": pending},
            )
        every = every[:, :2]
        if (every == every[0]).all():
            ready = mine  # the same names in the same order on every rank
        else:
            counts = [int(n) for n in every[:, 0]]
            everyone = np.asarray(api.allgather(keys, counts=counts, comm=communicator))
            bounds = np.cumsum([0, *counts])
            lists = [everyone[bounds[r] : bounds[r + 1]].tolist() for r in range(len(counts))]
            common = set(lists[0]).intersection(*lists[1:])
            by_key = {op.key: op for op in mine}
            ready = [by_key[key] for key in lists[0] if key in common]
            if any(len(keys_of_rank) > len(common) for keys_of_rank in lists):
                with self._lock:
                    for op in ready:
                        del self._pending[op.name]
                return ready, False
        with self._lock:
            for op in ready:
                del self._pending[op.name]
        return ready, True


def _run(op: _Op, communicator: api.Communicator) -> None:
    try:  # a torch.profiler range named after the collective's Horovod name, where recorded
        result = ranged(f"horovod.{op.name}", lambda: op.name, lambda: op.job(communicator))()
    except BaseException as error:
        op.future.set_exception(error)
    else:
        op.future.set_result(result)


_queues: "weakref.WeakKeyDictionary[api.Communicator, NamedOps]" = weakref.WeakKeyDictionary()
_queues_lock = threading.Lock()


def named_ops(communicator: api.Communicator) -> NamedOps:
    """The named collectives of ``communicator``, one queue per communicator."""
    with _queues_lock:
        queue = _queues.get(communicator)
        if queue is None:
            queue = _queues[communicator] = NamedOps(communicator)
        return queue
