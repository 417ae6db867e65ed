"""The communication thread: one per communicator, running its collectives in the order submitted."""

__all__: list[str] = []

import queue
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from ..communicator import Communicator, communicator_of
from ..dispatch import refuse
from ..selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")


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
    """

    def __init__(self, inline: bool, communicator: Communicator) -> None:
        self._inline = inline
        self.communicator = communicator  # the user's communicator's sibling: its calls never meet the user's
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        if not inline:
            threading.Thread(target=self._run, name="collectives-comm", daemon=True).start()

    def submit(self, job: Callable[[], T]) -> "Future[T]":
        future: Future[T] = Future()
        if self._inline:
            _run_job(job, future)
        else:
            self._jobs.put((job, future))
        return future

    def stop(self) -> None:
        """End the thread once the jobs before have run."""
        self._jobs.put(None)

    def _run(self) -> None:
        while (item := self._jobs.get()) is not None:
            _run_job(*item)
            # hold no tensor while idle: one freed here during interpreter shutdown would abort
            del item


def _run_job(job: Callable[[], T], future: "Future[T]") -> None:
    future.set_running_or_notify_cancel()
    try:
        with torch.no_grad():
            result = job()
    except BaseException as error:
        future.set_exception(error)
    else:
        future.set_result(result)


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
    worker.submit(lambda: refuse(worker.communicator, collective, AUTO, None, error)).result()
