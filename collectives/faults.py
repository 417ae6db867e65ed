"""Deterministic fault injection: a chosen rank fails at a chosen collective call or checkpoint write.

``COLLECTIVES_FAULT`` (read once, when the library is imported) names the
faults, comma-separated, each ``RANK:NUMBER[:HOW]`` or ``RANK:checkpoint:NUMBER[:HOW]``:

``RANK``
    the failing rank: the process's rank in its launch (``$PMI_RANK``,
    ``$OMPI_COMM_WORLD_RANK`` or ``$PMIX_RANK``), or, where no launcher says
    (one process, the loopback transport's threads), the rank of the call's
    communicator.
``NUMBER``
    counting from 0, the collective call of that rank that fails: every call
    the library's watchdog opens, on any communicator (numpy, torch, the
    repeat-call path, the store's collectives), in the order the rank makes
    them. With one communicator it is the call shown as ``#NUMBER`` in the
    flight recorder and the errors. ``checkpoint:NUMBER`` counts the rank's
    checkpoint writes instead (in memory or to a directory), and fails in the
    middle of that one: after part of it is written, before it is complete.
``HOW``
    ``kill`` (SIGKILL, the default), ``exit`` (``os._exit(3)``), ``hang``
    (sleep for good: the others end by their timeout), or ``raise``
    (:class:`InjectedFault`, for tests on threads).
``STEP`` (``RANK:NUMBER:HOW:STEP``, optional)
    fail in the middle of the call rather than as it begins: at its wait number
    ``STEP`` (from 0), counting the waits of its schedule's steps, once that
    step's messages are posted, and its barriers of shared memory, before
    arriving; the signature check's own wait is not counted. A call that ends
    before that step fails the rank as its next call begins.

Before it fails the rank writes one line naming itself and the call to stderr.
Nothing is checked on any call when the variable is unset: the watchdog tests one
attribute. Tests arm and disarm faults in process with :func:`arm` and :func:`disarm`.
"""

__all__ = [
    "CHECKPOINT",
    "FAULT_ENV",
    "HOWS",
    "PLAN",
    "Fault",
    "FaultPlan",
    "InjectedFault",
    "arm",
    "disarm",
    "launch_rank",
    "parse",
]

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError

FAULT_ENV = "COLLECTIVES_FAULT"
HOWS = ("kill", "exit", "hang", "raise")
CHECKPOINT = "checkpoint"
"""The kind of a fault that fails a checkpoint write rather than a collective call."""

_LAUNCH_RANK_ENVS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


class InjectedFault(RuntimeError):
    """The failure ``HOW=raise`` injects: not a library error, so the communicator breaks as on a crash."""


@dataclass(frozen=True)
class Fault:
    """One injected fault: ``rank`` fails at its ``number``-th call of ``kind``, by ``how``."""

    rank: int
    number: int
    how: str = "kill"
    kind: str = "collective"
    step: int | None = None

    def __str__(self) -> str:
        middle = f"{CHECKPOINT}:" if self.kind == CHECKPOINT else ""
        step = "" if self.step is None else f":{self.step}"
        return f"{self.rank}:{middle}{self.number}:{self.how}{step}"


def parse(text: str) -> tuple[Fault, ...]:
    """The faults ``text`` names (the syntax of ``$COLLECTIVES_FAULT``).

    Raises:
        ConfigurationError: a fault that does not read ``RANK:[checkpoint:]NUMBER[:HOW]``.
    """
    faults = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        fields = item.split(":")
        kind = "collective"
        if len(fields) >= 2 and fields[1] == CHECKPOINT:
            kind = CHECKPOINT
            del fields[1]
        how = fields[2] if len(fields) >= 3 else "kill"
        step = fields[3] if len(fields) == 4 else None
        if (
            len(fields) not in ((2, 3) if kind == CHECKPOINT else (2, 3, 4))
            or not all(f.isdigit() for f in fields[:2])
            or how not in HOWS
            or (step is not None and not step.isdigit())
        ):
            raise ConfigurationError(
                f"{FAULT_ENV}: {item!r} is not RANK:NUMBER[:HOW[:STEP]] or RANK:checkpoint:NUMBER[:HOW] "
                f"(HOW one of {', '.join(HOWS)})"
            )
        faults.append(Fault(int(fields[0]), int(fields[1]), how, kind, None if step is None else int(step)))
    return tuple(faults)


def launch_rank() -> int | None:
    """This process's rank as its launcher set it in the environment; ``None`` where none did."""
    for name in _LAUNCH_RANK_ENVS:
        text = os.environ.get(name, "").strip()
        if text.isascii() and text.isdigit():  # int() refuses some of what isdigit takes
            return int(text)
    return None


class FaultPlan:
    """The armed faults and each rank's count of calls; the watchdog asks it only while ``armed``.

    Attributes:
        armed: whether any fault is armed (the only attribute a call reads otherwise).
        faults: the armed faults.
        fired: the faults that fired (``raise`` only: the others end the process).
    """

    def __init__(self) -> None:
        self.armed = False
        self.faults: tuple[Fault, ...] = ()
        self.fired: list[Fault] = []
        self._launch_rank: int | None = None
        self._counts: dict[tuple[str, int], int] = {}
        # per rank, a fault due at a step of a call under way: [the call, the fault, what, waits seen]
        self._stepping: dict[int, list[Any]] = {}
        self._lock = threading.Lock()  # loopback ranks are threads of one process

    def set(self, faults: tuple[Fault, ...]) -> None:
        with self._lock:
            self.faults = faults
            self.fired = []
            self._counts = {}
            self._stepping = {}
            self._launch_rank = launch_rank()
            self.armed = bool(faults)

    def reached(self, rank: int, what: str, kind: str = "collective", call: object = None) -> bool:
        """A call of ``kind`` (``what`` names it, e.g. ``allreduce #5``) begins on communicator rank ``rank``.

        Fails here if a fault names this rank's call, or if a fault was due at a
        step of this rank's last call, which ended first. True when a fault is due
        at a step of this ``call``: the call must then report its waits to :meth:`stepped`.
        """
        me = rank if self._launch_rank is None else self._launch_rank
        with self._lock:
            late = self._stepping.pop(me, None)
            number = self._counts.get((kind, me), 0)
            self._counts[(kind, me)] = number + 1
            fault = next(
                (f for f in self.faults if f.rank == me and f.number == number and f.kind == kind), None
            )
            if late is not None:
                fault, what = late[1], f"{late[2]}, which ended before step {late[1].step}; as {what} began"
            elif fault is None:
                return False
            elif fault.step is not None:
                self._stepping[me] = [call, fault, what, 0]
                return True
            self.fired.append(fault)
        _fail(fault, me, what)
        return False

    def stepped(self, rank: int, call: object) -> None:
        """``call`` (on communicator rank ``rank``) waits once more: fail if this is its fault's step."""
        me = rank if self._launch_rank is None else self._launch_rank
        with self._lock:
            entry = self._stepping.get(me)
            if entry is None or entry[0] is not call:
                return
            _, fault, what, seen = entry
            if seen < fault.step:
                entry[3] = seen + 1
                return
            del self._stepping[me]
            self.fired.append(fault)
        _fail(fault, me, f"{what}, step {seen}")


def _fail(fault: Fault, rank: int, what: str) -> None:
    message = f"collectives: rank {rank}: injected fault {fault} ({FAULT_ENV}): {fault.how} at {what}"
    print(message, file=sys.stderr, flush=True)
    if fault.how == "raise":
        raise InjectedFault(message)
    if fault.how == "exit":
        os._exit(3)
    if fault.how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    while True:  # hang: only the others' timeout, or the launcher, ends this
        time.sleep(3600)


PLAN = FaultPlan()
"""The process's faults, from ``$COLLECTIVES_FAULT`` at import."""


def arm(faults: "str | tuple[Fault, ...]") -> None:
    """Arm ``faults`` (``$COLLECTIVES_FAULT``'s syntax, or parsed), replacing any armed; counts restart."""
    PLAN.set(parse(faults) if isinstance(faults, str) else tuple(faults))


def disarm() -> None:
    """Arm no fault: e.g. in a replacement rank that inherited the variable of the job it replaces."""
    PLAN.set(())


_text = os.environ.get(FAULT_ENV, "")
if _text.strip():
    arm(_text)
