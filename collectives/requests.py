"""Non-blocking collectives' requests: a communicator's started calls run in order on a thread of its own.

A call started by an ``i`` function (:func:`collectives.iallreduce` ...) is queued
on its communicator's *lane*, one thread that runs the queued calls one at a time
in the order they were started: as every rank starts its collectives in the same
order (MPI's rule), they pair up across ranks. A blocking call on a communicator
with started calls still queued or running waits for them first (:func:`settle`),
so it follows them in that order too, and two calls never run at once on one
communicator (which would raise :class:`~collectives.ConcurrentCallError`).
Where MPI lets only the main thread call it (``funneled``, ``single``) there is no
thread: a started call runs at once and its request is complete.

At exit, calls started and never waited for are finished first, each bounded by
its communicator's timeout like any call, so none is cut off inside MPI.
"""

__all__ = ["Request", "busy", "settle", "start", "test_all", "wait_all"]

import atexit
import contextlib
import queue
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any

from .communicator import Communicator, communicator_of

if TYPE_CHECKING:
    from mpi4py import MPI


class Request:
    """A collective started without waiting: :meth:`wait` for its result, or :meth:`test` whether it is done.

    The arrays passed to the call belong to it until it completes: ``x`` must not
    be changed, nor ``out`` read, before :meth:`wait` (or a :meth:`test` that says
    ``True``) returns. Any error of the call (a bad argument, a mismatch, a
    timeout) is raised by :meth:`wait` and :meth:`test`.
    """

    __slots__ = ("_future", "collective")

    def __init__(self, collective: str, future: "Future[Any]") -> None:
        self.collective = collective
        self._future = future

    def wait(self) -> Any:
        """Wait until the call completes and return its result (``out`` when given; ``None`` for a barrier).

        Bounded by the communicator's timeout, as every call is.

        Raises:
            Exception: the call's error, if it failed.
        """
        return self._future.result()

    def test(self) -> bool:
        """Whether the call has completed, without waiting.

        Raises:
            Exception: the call's error, if it completed by failing.
        """
        if not self._future.done():
            return False
        self._future.result()  # raises the call's error
        return True

    def __repr__(self) -> str:
        state = "done" if self._future.done() else "pending"
        return f"<Request {self.collective} {state}>"


def wait_all(requests: Iterable[Request]) -> list[Any]:
    """Wait for every request; their results in order.

    Raises:
        Exception: the first failed request's error, once all have completed.
    """
    requests = list(requests)
    for request in requests:  # every call completes before an error is raised
        with contextlib.suppress(Exception):
            request.wait()
    return [r.wait() for r in requests]


def test_all(requests: Iterable[Request]) -> bool:
    """Whether every request has completed, without waiting.

    Raises:
        Exception: the first completed request's error, if one failed.
    """
    return all([r.test() for r in requests])  # a list: test each, so every error can surface


busy: set["_Lane"] = set()
"""The lanes with calls queued or running; empty, a blocking call has nothing to wait for (one test)."""

_lanes: "weakref.WeakKeyDictionary[Communicator, _Lane]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_at_exit: list[bool] = []  # whether the handler is registered (once per process)


class _Lane:
    """One thread that runs a communicator's started calls one at a time, in the order started."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._unfinished = 0
        # no future is kept here: a failed call's traceback would hold its communicator alive
        self._idle = threading.Condition()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def ident(self) -> int | None:
        return self._thread.ident

    def submit(self, job: Callable[[], Any]) -> "Future[Any]":
        future: Future[Any] = Future()
        with self._idle:
            self._unfinished += 1
            busy.add(self)
        self._jobs.put((job, future))
        return future

    def wait_idle(self) -> None:
        """Wait until every call submitted so far has completed."""
        with self._idle:
            while self._unfinished:
                self._idle.wait()

    def finish(self) -> None:
        """Wait for the calls submitted so far, unless called from the lane's own thread (which runs them)."""
        if self.ident != threading.get_ident():
            self.wait_idle()

    def stop(self) -> None:
        """End the thread once the calls before have run."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            job, future = item
            _run_job(job, future)
            with self._idle:
                self._unfinished -= 1
                if not self._unfinished:
                    busy.discard(self)
                    self._idle.notify_all()
            # hold no array while idle
            del item, job, future


def _run_job(job: Callable[[], Any], future: "Future[Any]") -> None:
    future.set_running_or_notify_cancel()
    try:
        result = job()
    except BaseException as error:
        future.set_exception(error)
    else:
        future.set_result(result)


def _lane(group: Communicator) -> "_Lane | None":
    """``group``'s lane, started on its first started call; ``None`` where MPI allows only the main thread."""
    if group.transport.thread_level in ("funneled", "single"):
        return None
    with _lock:
        lane = _lanes.get(group)
        if lane is None:
            if not _at_exit:
                _at_exit.append(True)
                atexit.register(_finish_at_exit)  # runs before mpi4py's own MPI_Finalize
            lane = _lanes[group] = _Lane(f"collectives-requests-{group.rank}")
            weakref.finalize(group, lane.stop)
            group.before_free(lane.finish)
        return lane


def start(
    comm: "Communicator | MPI.Comm | None", collective: str, call: Callable[[Communicator], Any]
) -> Request:
    """Start ``call(group)``, a blocking collective on ``comm``'s communicator, on its lane.

    The communicator is found (made, the first time: collective) on the caller's
    thread, in the program's order.
    """
    group = communicator_of(comm)
    lane = _lane(group)
    if lane is None:
        future: Future[Any] = Future()
        _run_job(lambda: call(group), future)
        return Request(collective, future)
    return Request(collective, lane.submit(lambda: call(group)))


def settle(comm: "Communicator | MPI.Comm | None") -> None:
    """Wait until the calls started on ``comm``'s communicator have completed (their errors stay theirs).

    For a blocking call, so that it runs after them on every rank alike. Nothing
    to wait for on the lane's own thread, which runs them.
    """
    group = communicator_of(comm)
    lane = _lanes.get(group)
    if lane is not None:
        lane.finish()


def _finish_at_exit() -> None:
    """Let the calls started and never waited for complete before MPI is finalized."""
    for lane in list(busy):
        with contextlib.suppress(BaseException):
            lane.wait_idle()
