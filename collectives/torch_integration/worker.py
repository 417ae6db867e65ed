"""The communication thread: one per communicator, running its collectives in the order submitted.

It is the library's one job thread (:class:`collectives.requests.JobThread`), as the numpy
non-blocking calls' lanes are, with torch's concerns: no autograd in a job, a sibling communicator.
"""

__all__ = [
    "BackgroundWorker",
    "background_worker",
    "before_waiting",
    "wait_for",
]

import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

import torch

from ..communicator import Communicator
from ..dispatch import escaped
from ..requests import JobFuture, JobThread, before_waiting

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

    def run_in_order(self, job: Callable[[Communicator], T], what: str) -> T:
        """``job(communicator)``, run after the jobs submitted before it; its result (see :meth:`wait`).

        A torch call refused by this rank's checks tells the other ranks so
        (:func:`collectives.dispatch.checked`), in the call's place.
        """
        return self.wait(self.submit(lambda: job(self.communicator)), what)


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
