"""The trace's buffer: each call's record kept in memory (bounded), written to the rank's file off the call.

Tracing is on where ``$COLLECTIVES_TRACE`` names a folder (for scripts left
unchanged), or inside ``with collectives.trace(folder):``. A call's record is a
tuple appended to a bounded deque as the call ends: the watchdog's
(:meth:`Tracer.ended`) or a lean repeat's (:data:`Tracer.record`, from
:mod:`collectives.lean`); nothing is formatted on the call's path. A writer thread
turns the records into Chrome trace events when the deque is half full; the rest
are written at exit, when a call times out or breaks, and on demand
(:func:`flush`). Where the writer cannot keep up the oldest records are dropped,
and the file says how many.

With tracing off, a call pays one attribute test (``TRACER.on``).
"""

__all__ = [
    "BUFFER_ENV",
    "HANG_MARKER",
    "LEVEL_ENV",
    "TRACER",
    "TRACE_ENV",
    "Tracer",
    "flush",
    "number_of",
    "trace",
]

import atexit
import contextlib
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .._env import env_count
from ..errors import ConfigurationError
from .events import SPAN, RankFile

T = TypeVar("T")
TRACE_ENV = "COLLECTIVES_TRACE"
LEVEL_ENV = "COLLECTIVES_TRACE_LEVEL"
BUFFER_ENV = "COLLECTIVES_TRACE_BUFFER"
HANG_MARKER = "hang-marker.txt"  # a rank's dump on a timeout leaves it; the others' writers answer it
DEFAULT_BUFFER = 200_000  # records per process: about 40 MB at most, written when half full
_LEVELS = ("calls", "steps")
_WRITER_POLL_S = 0.25

_next_number = [1]  # the next communicator's number in this process
_communicators: "weakref.WeakValueDictionary[int, Any]" = weakref.WeakValueDictionary()


def number_of(watchdog: Any) -> int:
    """A new communicator's number in this process (its ranks agree on one as it is made: :func:`agreed`).

    The watchdog is kept (weakly) so that a timeout's dump can show every communicator's last calls.
    """
    number = _next_number[0]
    _next_number[0] = number + 1
    _communicators[number] = watchdog
    return number


def agreed(watchdog: Any, number: int, numbers: list[int]) -> int:
    """The number the ranks of a new communicator agree on: the largest of theirs (``numbers``).

    Ranks that made different numbers of communicators before (a store's server, a subgroup's
    members) would name one communicator differently, and a merged trace could not pair its calls;
    this process numbers its later ones past the agreed number.
    """
    chosen = max(numbers, default=number)
    if chosen != number:
        _communicators.pop(number, None)
        _communicators[chosen] = watchdog
        _next_number[0] = max(_next_number[0], chosen + 1)
    return chosen


class Tracer:
    """This process's trace: whether it is on, its buffer of records, and the rank file they go to.

    Attributes:
        on: whether calls are traced (read once by every call).
        steps: whether each schedule step is traced too (``$COLLECTIVES_TRACE_LEVEL=steps``).
        record: appends one record to the buffer (a lean repeat's: itself, sequence, start, end, tag).
        folder: where the rank's files go, while on.
    """

    __slots__ = (
        "_buffer",
        "_dumped",
        "_dumped_own",
        "_file",
        "_lock",
        "_stack",
        "_wake",
        "_writer",
        "folder",
        "on",
        "record",
        "steps",
    )

    def __init__(self) -> None:
        self.on = False
        self.steps = False
        self.folder: str | None = None
        self._buffer: deque[tuple[Any, ...]] = deque(maxlen=DEFAULT_BUFFER)
        self.record: Callable[[tuple[Any, ...]], None] = self._buffer.append
        self._file: RankFile | None = None
        self._lock = threading.RLock()
        self._stack: list[tuple[str | None, bool]] = []
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._dumped = 0.0  # when the folder's hang marker was last written or answered
        self._dumped_own = False  # a dump of this rank's own timeout: not overwritten by answers

    # --- on and off

    def start(self, folder: str, steps: bool = False, buffer: int | None = None) -> None:
        """Trace every call from now on into ``folder`` (made if missing); steps too with ``steps``."""
        with self._lock:
            self._stack.append((self.folder, self.steps))
            self._switch(folder, steps, buffer)

    def stop(self) -> None:
        """Write what is buffered and go back to the state before the matching :meth:`start`."""
        with self._lock:
            folder, steps = self._stack.pop() if self._stack else (None, False)
            if folder is None:
                self.flush()
                self._file = None
                self.on = self.steps = False
                self.folder = None
                return
            self._switch(folder, steps, None)

    def _switch(self, folder: str, steps: bool, buffer: int | None) -> None:
        if folder != self.folder:
            self.flush()
            os.makedirs(folder, exist_ok=True)
            self._file = RankFile(folder)
            self.folder = folder
            self._dumped = _stamp(folder)  # a marker of an earlier run is no news
            self._dumped_own = False
        if buffer is not None and buffer != self._buffer.maxlen:
            self.flush()
            self._buffer = deque(maxlen=buffer)
            self.record = self._buffer.append
        self.steps = steps
        self.on = True
        if self._writer is None:
            self._writer = threading.Thread(
                target=self._write_when_half_full, name="collectives-trace", daemon=True
            )
            self._writer.start()

    # --- the records

    def ended(self, watchdog: Any, call: Any, now: float) -> None:
        """Record a call the watchdog ended; a call that did not end well writes the trace and a dump."""
        outcome = call.outcome
        self.record(
            (watchdog, call.signature, call.algorithm, call.sequence, call.began, now, outcome, watchdog.tag)
        )
        if outcome != "ok" and call.signature.collective != "setup":
            self.flush(dump=f"{call.signature.collective} #{call.sequence} {outcome}")

    def span(self, name: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``function(*args, **kwargs)``, recorded as an operation ``name`` (a key-value store's push)."""
        began = time.monotonic()
        outcome = "ok"
        try:
            return function(*args, **kwargs)
        except BaseException as error:
            outcome = f"failed: {type(error).__name__}"
            raise
        finally:
            self.record((SPAN, name, began, time.monotonic(), outcome))

    def clock(self, number: int, result: dict[str, Any]) -> None:
        """State communicator ``number``'s clock comparison (:mod:`collectives.tracing.clock`) in the file."""
        with self._lock:
            if self._file is not None:
                self._file.clock[number] = result

    def flush(self, dump: str | None = None, answering: str | None = None) -> None:
        """Write the buffered records to the rank's file now; with ``dump``, flight records and stacks too.

        A dump of this rank's own (``answering`` is ``None``) leaves a marker in the
        folder, which the other ranks' writers answer with dumps of theirs.
        """
        with self._lock:
            file = self._spill()
            if file is None:
                return
            file.write()
            if dump is not None and not (answering and self._dumped_own):
                file.dump(dump, dict(_communicators))
                if answering is None:  # tell the other ranks' writers to dump too
                    self._dumped_own = True
                    with open(os.path.join(file.folder, HANG_MARKER), "w") as marker:
                        marker.write(f"{file.rank}: {dump}\n")
            if dump is not None:
                self._dumped = _stamp(file.folder)

    def _spill(self) -> RankFile | None:
        """Append the buffered records to the rank's events file (``rank<R>.json`` is rewritten by flush)."""
        with self._lock:
            file = self._file
            if file is None:
                return None
            buffer = self._buffer
            records = [buffer.popleft() for _ in range(len(buffer))]
            if len(records) == buffer.maxlen:  # it may have been full: count what fell out meanwhile
                file.note_full()
            file.add(records)
            return file

    def _write_when_half_full(self) -> None:
        while True:
            self._wake.wait(_WRITER_POLL_S)
            self._wake.clear()
            buffer = self._buffer
            maxlen = buffer.maxlen or 1
            folder = self.folder
            with contextlib.suppress(OSError):  # a full disk loses the trace, never the job
                if self.on and len(buffer) * 2 >= maxlen:
                    self._spill()
                if folder is not None and _stamp(folder) > self._dumped:
                    with open(os.path.join(folder, HANG_MARKER)) as marker:
                        told = marker.read().strip()
                    self.flush(dump=f"rank {told}", answering=told)


def _stamp(folder: str) -> float:
    """When the folder's hang marker was written; 0 where there is none."""
    try:
        return os.stat(os.path.join(folder, HANG_MARKER)).st_mtime
    except OSError:
        return 0.0


def _buffer_size() -> int:
    size = env_count(BUFFER_ENV, "records", 1000, 100_000_000)
    return DEFAULT_BUFFER if size is None else size


def _level(steps: bool | None) -> bool:
    if steps is not None:
        return steps
    text = os.environ.get(LEVEL_ENV, "").strip().lower() or "calls"
    if text not in _LEVELS:
        raise ConfigurationError(f"{LEVEL_ENV}={text!r} is neither 'calls' nor 'steps'")
    return text == "steps"


TRACER = Tracer()
"""This process's tracer: ``TRACER.on`` is the one test a call makes."""


@contextlib.contextmanager
def trace(folder: str | os.PathLike[str], *, steps: bool | None = None) -> Iterator[Tracer]:
    """Trace the collectives called inside the block into ``folder``: a Chrome trace file per rank.

    Args:
        folder: where each rank writes ``rank<R>.json`` (made if missing).
        steps: trace each schedule step too (send, receive, reduce, copy, barrier);
            ``$COLLECTIVES_TRACE_LEVEL`` (``calls`` or ``steps``) when ``None``.

    The files are written when the block ends (and when a call times out); open
    them in Perfetto or chrome://tracing, or merge the ranks' with
    ``python -m collectives trace merge FOLDER -o job.json``.
    """
    TRACER.start(os.fspath(folder), _level(steps), _buffer_size())
    try:
        yield TRACER
    finally:
        TRACER.stop()


def flush() -> None:
    """Write what the trace has buffered to the rank's file now (it is written at exit anyway)."""
    TRACER.flush()


def _from_environment() -> None:
    folder = os.environ.get(TRACE_ENV, "").strip()
    if folder:
        TRACER.start(folder, _level(None), _buffer_size())


def _at_exit() -> None:
    with contextlib.suppress(OSError):
        TRACER.flush()


_from_environment()
atexit.register(_at_exit)
