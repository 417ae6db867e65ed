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

__all__ = [
    "JobFuture",
    "JobThread",
    "Request",
    "before_waiting",
    "busy",
    "settle",
    "start",
    "test_all",
    "wait_all",
]

import atexit
import contextlib
import math
import queue
import threading
import weakref
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import TYPE_CHECKING, Any, TypeVar

from .communicator import Communicator, communicator_of
from .errors import CollectiveTimeout

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")


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


busy: set["JobThread"] = set()
"""The lanes with calls queued or running; empty, a blocking call has nothing to wait for (one test)."""

_lanes: "weakref.WeakKeyDictionary[Communicator, JobThread]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()
_at_exit: list[bool] = []  # whether the handler is registered (once per process)

# a job ending with its communicator's timeout raises its own error a moment later; a wait gives it this long
_GRACE_S = 1.0


class _Here(threading.local):
    """What this thread is doing for a job thread: running one of its jobs, or a finished job's callbacks."""

    runner: "JobThread | None" = None
    phase = ""


_here = _Here()


class JobFuture(Future[T]):
    """A submitted job's future, which knows the thread that runs it (so a wait can tell a stuck one)."""

    def __init__(self, thread: "JobThread") -> None:
        super().__init__()
        self.thread = thread


class JobThread:
    """One thread that runs jobs one at a time, in the order they were submitted: one design for every use.

    The numpy non-blocking calls run on one per communicator (its *lane*), and
    the torch integration's collectives on its communication thread
    (:class:`~collectives.torch_integration.worker.BackgroundWorker`). Every rank
    submits its jobs in its program order, so the collectives in them pair up.
    With ``inline`` (where MPI lets only the main thread call it) there is no
    thread: a job runs at once on the caller's. With ``tracked`` the thread is in
    :data:`busy` while it has jobs, for blocking calls to wait for them.

    A finished job's future runs its callbacks (torch's ``then``) on the thread.
    A callback that submits a job, or waits for one, would wait for itself, so
    then a new thread takes over the queue and the old one ends with its
    callbacks (:func:`before_waiting`): the jobs still run one at a time, in the
    order submitted.
    """

    def __init__(self, name: str, *, inline: bool = False, tracked: bool = False) -> None:
        self.inline = inline
        self._name = name
        self._tracked = tracked
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], JobFuture[Any]] | None] = queue.SimpleQueue()
        self._unfinished = 0
        # no future is kept here: a failed call's traceback would hold its communicator alive
        self._idle = threading.Condition()
        self._runner: threading.Thread | None = None
        self.progress = 0  # jobs started plus jobs finished: a wait that sees none for a timeout is stuck
        if not inline:
            self._start_runner()

    def _start_runner(self) -> None:
        self._runner = threading.Thread(target=self._run, name=self._name, daemon=True)
        self._runner.start()

    def submit(self, job: Callable[[], T]) -> JobFuture[T]:
        """Run ``job()`` after the jobs submitted before; its future."""
        future: JobFuture[T] = JobFuture(self)
        if self.inline:
            future.set_running_or_notify_cancel()
            result, error = self._outcome(job)
            if error is not None:
                self._failed_inline(error)
            _settle(future, result, error)
            return future
        with self._idle:
            self._unfinished += 1
            if self._tracked:
                busy.add(self)
        self._jobs.put((job, future))
        before_waiting()
        return future

    def _outcome(self, job: Callable[[], T]) -> tuple[T | None, BaseException | None]:
        """Run ``job``: its result or its error (a subclass may run it in a context of its own)."""
        try:
            return job(), None
        except BaseException as error:
            return None, error

    def _failed_inline(self, error: BaseException) -> None:
        """A job run on the caller's thread raised ``error`` (a subclass may account for it there)."""

    def wait_idle(self) -> None:
        """Wait until every job submitted so far has completed."""
        with self._idle:
            while self._unfinished:
                self._idle.wait()

    def finish(self) -> None:
        """Wait for the jobs submitted so far, unless called from the thread itself (which runs them)."""
        runner = self._runner
        if runner is None or runner.ident != threading.get_ident():
            self.wait_idle()

    def wait(self, future: "Future[T]", what: str, timeout: float) -> T:
        """``future``'s result (one of this thread's jobs), raising its error.

        Raises:
            CollectiveTimeout: the thread started and finished no job for ``timeout``
                seconds (and a second), so ``future`` would never come.
        """
        before_waiting()
        while not self.inline and math.isfinite(timeout):
            seen = self.progress
            if wait_futures([future], timeout + _GRACE_S).done:
                break
            if self.progress == seen:
                raise CollectiveTimeout(
                    f"{what}: the communication thread ran no job for {timeout:g} s; is a job waiting "
                    "for a later one, or a callback for a job it has not started?",
                    collective=what,
                )
        return future.result()

    def stop(self) -> None:
        """End the thread once the jobs before have run."""
        self._jobs.put(None)

    def hand_over(self) -> None:
        """If this thread runs the queue and is in a finished job's callbacks, a new thread takes it over."""
        with self._idle:
            if self._runner is threading.current_thread():
                self._start_runner()

    def _run(self) -> None:
        me = threading.current_thread()
        _here.runner = self
        while (item := self._jobs.get()) is not None:
            job, future = item
            del item  # hold no array while idle: one freed during interpreter shutdown could abort
            self.progress += 1
            _here.phase = "job"
            future.set_running_or_notify_cancel()
            result, error = self._outcome(job)
            self.progress += 1
            _here.phase = "callbacks"
            _settle(future, result, error)
            del job, future, result, error
            _here.phase = ""
            with self._idle:
                self._unfinished -= 1
                if not self._unfinished:
                    busy.discard(self)
                    self._idle.notify_all()
                if self._runner is not me:  # a callback handed the queue over: that thread runs it now
                    return


def _settle(future: "Future[T]", result: T | None, error: BaseException | None) -> None:
    """Complete ``future``; its callbacks run here."""
    if error is None:
        future.set_result(result)  # type: ignore[arg-type]
    else:
        future.set_exception(error)


def before_waiting() -> None:
    """Called before this thread submits a job or waits for one, in case it runs a job's callbacks.

    The job it wants could otherwise run only on this thread, after the callbacks.
    """
    if _here.phase == "callbacks" and _here.runner is not None:
        _here.runner.hand_over()


def _lane(group: Communicator) -> JobThread:
    """``group``'s lane, started on its first started call; inline where MPI allows only the main thread."""
    with _lock:
        lane = _lanes.get(group)
        if lane is None:
            if not _at_exit:
                _at_exit.append(True)
                atexit.register(_finish_at_exit)  # runs before mpi4py's own MPI_Finalize
            inline = group.transport.thread_level in ("funneled", "single")
            lane = JobThread(f"collectives-requests-{group.rank}", inline=inline, tracked=True)
            _lanes[group] = lane
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
    return Request(collective, _lane(group).submit(lambda: call(group)))


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
