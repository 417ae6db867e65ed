"""The communication thread: one per communicator, running its collectives in the order submitted.

It is the library's one job thread (:class:`collectives.requests.JobThread`), as the numpy
non-blocking calls' lanes are, with torch's concerns: no autograd in a job, a sibling communicator.
"""

__all__ = [
    "BackgroundWorker",
    "api_communicator",
    "background_worker",
    "before_waiting",
    "tell_refusal",
    "wait_for",
]

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING, TypeVar

import torch

from ..communicator import Communicator, communicator_of
from ..dispatch import escaped, refuse
from ..requests import JobFuture, JobThread, before_waiting
from ..selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")


class BackgroundWorker(JobThread):
    """A communicator's communication thread: the library's job thread (:class:`.requests.JobThread`).

    Its jobs run on :attr:`communicator`, the user's communicator's
    :meth:`~collectives.Communicator.sibling`, so the user's own calls on the
    user's communicator from another thread never meet them; each under
    ``torch.no_grad()``. Inline (``funneled``, ``single``), an interrupt between a
    job's collectives is accounted for on the caller's thread.
    """

    def __init__(self, inline: bool, communicator: Communicator) -> None:
        self.communicator = communicator  # the user's communicator's sibling: its calls never meet the user's
        super().__init__("collectives-comm", inline=inline)

    def _outcome(self, job: Callable[[], T]) -> tuple[T | None, BaseException | None]:
        with torch.no_grad():
            return super()._outcome(job)

    def _failed_inline(self, error: BaseException) -> None:
        escaped(self.communicator, "a torch job", error)  # an interrupt between a job's collectives

    def wait(self, future: "Future[T]", what: str, timeout: float | None = None) -> T:
        """``future``'s result, bounded by the communicator's timeout (see :meth:`JobThread.wait`)."""
        return super().wait(future, what, self.communicator.timeout if timeout is None else timeout)


def wait_for(future: "Future[T]", what: str, seconds: float | None = None) -> T:
    """``future``'s result, raising its error: within ``seconds``, or while a job's thread makes progress.

    Raises:
        TimeoutError: ``seconds`` passed first; :class:`~collectives.CollectiveTimeout`
            where the job's thread ran no job for its communicator's timeout.
    """
    thread = future.thread if isinstance(future, JobFuture) else None
    if seconds is None and isinstance(thread, BackgroundWorker):
        return thread.wait(future, what)
    before_waiting()
    return future.result(seconds)


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
