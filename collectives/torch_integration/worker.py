"""The communication thread: one per communicator, running its collectives in the order submitted."""

__all__: list[str] = []

import math
import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import wait as wait_any
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..communicator import Communicator, communicator_of
from ..dispatch import escaped, refuse
from ..errors import CollectiveTimeout
from ..selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")

# a job ending with the group's timeout raises its own error a moment later; a wait gives it this long
_GRACE_S = 1.0


class _Here(threading.local):
    """What this thread is doing for a worker: running one of its jobs, or a finished job's callbacks."""

    worker: "BackgroundWorker | None" = None
    phase = ""


_here = _Here()


class Job(Future[T]):
    """A submitted job's future, which knows the worker that runs it (so a wait can tell a stuck one)."""

    def __init__(self, worker: "BackgroundWorker") -> None:
        super().__init__()
        self.worker = worker


class BackgroundWorker:
    """One thread that runs a communicator's collectives one at a time, in the order they were submitted.

    They run on :attr:`communicator`, the user's communicator's
    :meth:`~collectives.Communicator.sibling`, so the user's own calls on the
    user's communicator from another thread never meet them.

    Every rank submits its collectives in its program order, which is the same
    on every rank, so the collectives pair up; and two collectives on one
    communicator never interleave their messages. Where MPI lets only the main
    thread call it (``funneled``, ``single``) there is no thread: a job runs
    at once on the caller's.

    A finished job's future runs its callbacks (torch's ``then``) on the
    thread. A callback that submits a job, or waits for one, would wait for
    itself, so then a new thread takes over the queue and the old one ends
    with its callbacks: the jobs still run one at a time, in the order
    submitted. A job that waits for a later one (a mistake) raises
    :class:`~collectives.CollectiveTimeout` after the timeout, from :meth:`wait`.
    """

    def __init__(self, inline: bool, communicator: Communicator) -> None:
        self._inline = inline
        self.communicator = communicator  # the user's communicator's sibling: its calls never meet the user's
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Job[Any]] | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._runner: threading.Thread | None = None
        self._progress = 0  # jobs started plus jobs finished: a wait that sees none for the timeout is stuck
        if not inline:
            self._start_runner()

    def _start_runner(self) -> None:
        self._runner = threading.Thread(target=self._run, name="collectives-comm", daemon=True)
        self._runner.start()

    def submit(self, job: Callable[[], T]) -> "Job[T]":
        future: Job[T] = Job(self)
        if self._inline:
            future.set_running_or_notify_cancel()
            outcome = _outcome(job)
            if outcome[1] is not None:  # on the caller's thread: an interrupt between a job's collectives
                escaped(self.communicator, "a torch job", outcome[1])
            _settle(future, outcome)
        else:
            self._jobs.put((job, future))
            before_waiting()
        return future

    def stop(self) -> None:
        """End the thread once the jobs before have run."""
        self._jobs.put(None)

    def wait(self, future: "Future[T]", what: str) -> T:
        """``future``'s result (one of this worker's jobs), raising its error.

        Raises:
            CollectiveTimeout: the thread started and finished no job for the
                communicator's timeout (and a second), so ``future`` would never come.
        """
        before_waiting()
        limit = self.communicator.timeout
        while not self._inline and math.isfinite(limit):
            seen = self._progress
            if wait_any([future], limit + _GRACE_S).done:
                break
            if self._progress == seen:
                raise CollectiveTimeout(
                    f"{what}: the communication thread ran no job for {limit:g} s; is a job waiting "
                    "for a later one, or a callback for a job it has not started?",
                    collective=what,
                )
        return future.result()

    def hand_over(self) -> None:
        """If this thread runs the queue and is in a finished job's callbacks, a new thread takes it over."""
        with self._lock:
            if self._runner is threading.current_thread():
                self._start_runner()

    def _run(self) -> None:
        me = threading.current_thread()
        _here.worker = self
        while (item := self._jobs.get()) is not None:
            job, future = item
            # hold no tensor while idle: one freed here during interpreter shutdown would abort
            del item
            self._progress += 1
            _here.phase = "job"
            future.set_running_or_notify_cancel()
            outcome = _outcome(job)
            self._progress += 1
            _here.phase = "callbacks"
            _settle(future, outcome)
            del job, future, outcome
            _here.phase = ""
            with self._lock:
                if self._runner is not me:  # a callback handed the queue over: that thread runs it now
                    return


def before_waiting() -> None:
    """Called before this thread submits a job or waits for one, in case it runs a job's callbacks.

    The job it wants could otherwise run only on this thread, after the callbacks.
    """
    if _here.phase == "callbacks" and _here.worker is not None:
        _here.worker.hand_over()


def wait_for(future: "Future[T]", what: str, seconds: float | None = None) -> T:
    """``future``'s result, raising its error: within ``seconds``, or while a job's thread makes progress.

    Raises:
        TimeoutError: ``seconds`` passed first; :class:`~collectives.CollectiveTimeout`
            where the job's thread ran no job for its communicator's timeout.
    """
    worker = future.worker if isinstance(future, Job) else None
    if seconds is None and worker is not None:
        return worker.wait(future, what)
    before_waiting()
    return future.result(seconds)


def _outcome(job: Callable[[], T]) -> tuple[T | None, BaseException | None]:
    try:
        with torch.no_grad():
            return job(), None
    except BaseException as error:
        return None, error


def _settle(future: "Future[T]", outcome: tuple[T | None, BaseException | None]) -> None:
    """Complete ``future`` with ``outcome``; its callbacks run here."""
    result, error = outcome
    if error is None:
        future.set_result(result)  # type: ignore[arg-type]
    else:
        future.set_exception(error)


_workers: "weakref.WeakKeyDictionary[Communicator, BackgroundWorker]" = weakref.WeakKeyDictionary()
_workers_lock = threading.Lock()


def background_worker(communicator: Communicator) -> BackgroundWorker:
    with _workers_lock:
        worker = _workers.get(communicator)
        if worker is None:
            inline = communicator.transport.thread_level in ("funneled", "single")
            # its own messages (a collective call, made on the caller's thread in program order), so the
            # user's own calls on the communicator, from the main thread, never meet the worker's
            worker = BackgroundWorker(inline, communicator if inline else communicator.sibling())
            _workers[communicator] = worker
            weakref.finalize(communicator, worker.stop)
        return worker


def api_communicator(comm: "Communicator | MPI.Comm | None") -> Communicator:
    """The communicator api runs ``comm``'s collectives on; for ``None`` the one over ``MPI.COMM_WORLD``.

    Created on first use, a collective call.
    """
    return communicator_of(comm)


def tell_refusal(communicator: Communicator, collective: str, error: Exception) -> None:
    """Tell the other ranks that this rank's checks of ``collective`` failed, so theirs raises too.

    It goes on the communicator's thread, in order with the collectives started
    before it, as a poisoned signature (see :meth:`collectives.watchdog.Watchdog.poison`).
    """
    worker = background_worker(communicator)
    worker.wait(worker.submit(lambda: refuse(worker.communicator, collective, AUTO, None, error)), collective)
