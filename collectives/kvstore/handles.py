"""What a worker keeps of its keys and requests: key layouts, requests in flight, handles, pulled values."""

__all__ = [
    "Claim",
    "Claimant",
    "Handle",
    "KeyInfo",
    "Pulled",
    "ServerRequest",
    "Waiter",
    "checked_value",
    "claimed",
    "error_from",
    "filler",
    "row_filler",
]

import functools
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar

import numpy as np

from ..errors import KeyMismatchError, KVStoreError, KVStoreTimeout
from ..tracing.recorder import TRACER
from ._wire import Message, Refusal
from .layout import Partition

P = ParamSpec("P")
T = TypeVar("T")


class Claim:
    """Which thread's call runs on a store: one at a time, so no call's messages meet another's.

    Taken without waiting before a call checks or sends anything, in one step that
    also records the thread (a dict's ``setdefault``, atomic with or without the
    GIL), so that no interrupt falls between taking it and knowing who holds it; a
    call the store makes inside one of the same thread's holds it already.
    """

    def __init__(self) -> None:
        self.held: dict[int, int] = {}  # {0: the thread holding it}, while one does
        self.owner = 0  # the thread holding it; only this thread ever finds its own number here
        self.flush: Callable[[], None] | None = None  # run as the outermost call returns: its requests leave
        # run with an error leaving the outermost call (see WorkerLink.escaped): the store's boundary
        self.escaped: Callable[[str, BaseException], None] | None = None

    def ended(self, what: str, error: BaseException, me: int) -> None:
        """``error`` leaves thread ``me``'s call ``what``: if it held the claim, account and give it back."""
        if self.held.get(0) != me:  # refused (another thread's call runs), or interrupted before taking it
            return
        try:
            if self.escaped is not None:
                self.escaped(what, error)
        finally:
            self.owner = 0
            del self.held[0]


class Claimant(Protocol):
    """What holds a :class:`Claim`: the store, and its link."""

    claim: Claim

    @property
    def rank(self) -> int: ...


C = TypeVar("C", bound=Claimant)


def claimed(method: Callable[Concatenate[C, P], T]) -> Callable[Concatenate[C, P], T]:
    """``method`` of the store (or its link), run only while this thread holds the store's :class:`Claim`.

    The boundary of every call on the store: an error leaving it is accounted for
    by :attr:`Claim.escaped` (an interrupt breaks the store on every rank).

    Raises:
        KVStoreError: another thread's call on the store is running; nothing of this one was sent.
    """

    @functools.wraps(method)
    def call(store: C, /, *args: P.args, **kwargs: P.kwargs) -> T:
        claim, me = store.claim, threading.get_ident()
        if claim.owner == me:
            return method(store, *args, **kwargs)
        try:
            owner = claim.held.setdefault(0, me)
            if owner != me:
                raise KVStoreError(
                    f"rank {store.rank}: {_thread_name(me)} called {method.__name__} on a store while "
                    f"{_thread_name(owner)}'s call on it was running; order the threads' calls on one store"
                )
            claim.owner = me
            if TRACER.on:  # the store's operation as a span on the trace
                result = TRACER.span(f"kv.{method.__name__}", method, store, *args, **kwargs)
            else:
                result = method(store, *args, **kwargs)
            if claim.flush is not None:
                claim.flush()
        except BaseException as error:
            claim.ended(method.__name__, error, me)
            raise
        claim.owner = 0  # no interrupt can fall between these two (no call between them)
        del claim.held[0]
        return result

    return call


def _thread_name(ident: int) -> str:
    thread = next((t for t in threading.enumerate() if t.ident == ident), None)
    return f"thread {thread.name!r}" if thread is not None else "another thread"


@dataclass
class KeyInfo:
    """A key as a worker knows it: its shape, dtype, partitions, and this worker's pushes of it."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    parts: tuple[Partition, ...]
    pushes: int = 0  # this worker's pushes of the key: its round in sync mode

    @property
    def row(self) -> int:
        """Elements of a row: of the first axis's entries, which partitions never split."""
        return math.prod(self.shape[1:]) if len(self.shape) > 1 else 1

    @property
    def description(self) -> str:
        return f"{self.dtype.name}|{','.join(map(str, self.shape))}"


@dataclass
class Pulled:
    """What a pull returned: the value, and the clocks or rounds it includes.

    Attributes:
        value: the array.
        included: per partition, ``sync``: the rounds aggregated into it;
            ``ssp``: the last clock whose pushes from every worker it includes
            (-1 for none); ``async``: the pushes applied to it.
    """

    value: np.ndarray
    included: tuple[int, ...]


class ServerRequest:
    """A request sent to a server, and what its reply brought."""

    __slots__ = ("aux", "done", "error", "fault", "key", "on_data", "server", "stamp", "workers")

    def __init__(self, server: int, key: Any, on_data: Callable[[Message], None] | None) -> None:
        self.server = server
        self.key = key
        self.on_data = on_data
        self.done = False
        self.error: str | None = None
        self.fault = Refusal.OTHER
        self.aux = 0
        self.workers: tuple[int, ...] = ()
        self.stamp = 0


class Waiter(Protocol):
    """What a handle waits through: the store's link (see ``kvstore.link``)."""

    def test(self, requests: list[ServerRequest]) -> None: ...

    def wait_for(self, requests: list[ServerRequest]) -> None: ...


class Handle:
    """A push or pull in flight: :meth:`wait` for it, or :meth:`test` whether it is done."""

    def __init__(self, link: Waiter, requests: list[ServerRequest], result: Callable[[], Any]) -> None:
        self._link = link
        self._requests = requests
        self._result = result
        self._finished = False

    def test(self) -> bool:
        """Whether it has completed (its errors are raised by :meth:`wait`).

        Raises:
            KVStoreError: another thread's call on the store is running (as :meth:`wait` would).
        """
        if not all(r.done for r in self._requests):
            self._link.test(self._requests)
        return all(r.done for r in self._requests)

    def wait(self) -> Any:
        """Block until it completes; the pulled value(s) for a pull, ``None`` for a push.

        Raises:
            KVStoreError: a server refused it (the message names the key, server and workers).
            KVStoreTimeout: a server did not answer, or waited in vain for other workers.
        """
        self._link.wait_for(self._requests)
        if not self._finished:
            self._finished = True
            for request in self._requests:
                if request.error is not None:
                    raise error_from(request)
        return self._result()

    def followed_by(self, later: "Handle") -> "Handle":
        """This call and ``later`` (a pull after a push) as one handle: both waited for, ``later``'s value."""
        return Handle(self._link, self._requests + later._requests, later._result)


def checked_value(key: Any, meta: KeyInfo, value: Any, rank: int, out: bool = False) -> np.ndarray:
    """``value`` (or an ``out``) of ``key`` as a flat array, checked against the key's shape and dtype."""
    array = value if out else np.ascontiguousarray(value)
    if not isinstance(array, np.ndarray) or array.shape != meta.shape or array.dtype != meta.dtype:
        what = (
            f"{array.dtype.name}{list(array.shape)}"
            if isinstance(array, np.ndarray)
            else type(value).__name__
        )
        raise KeyMismatchError(
            f"{'out' if out else 'value'} for key {key!r} on rank {rank} is {what}; "
            f"the key is {meta.dtype.name}{list(meta.shape)}"
        )
    if out and not array.flags.c_contiguous:
        raise KeyMismatchError(f"out for key {key!r} on rank {rank} is not C-contiguous")
    return array.reshape(-1)


def error_from(request: ServerRequest) -> KVStoreError:
    text = request.error or ""
    if request.fault == Refusal.LATE:
        return KVStoreTimeout(text, key=request.key, workers=request.workers, servers=(request.server,))
    if request.fault == Refusal.MISMATCH:
        return KeyMismatchError(text)
    return KVStoreError(text)


def row_filler(
    target: np.ndarray, where: np.ndarray, dtype: np.dtype[Any], seen: list[int], index: int
) -> Callable[[Message], None]:
    def fill(message: Message) -> None:
        target[where] = np.frombuffer(message.data, dtype, target[where].size).reshape(target[where].shape)
        seen[index] = message.stamp

    return fill


def filler(
    flat: np.ndarray, p: Partition, dtype: np.dtype[Any], seen: list[int]
) -> Callable[[Message], None]:
    def fill(message: Message) -> None:
        flat[p.lo : p.hi] = np.frombuffer(message.data, dtype, p.hi - p.lo)
        seen[p.index] = message.stamp

    return fill
