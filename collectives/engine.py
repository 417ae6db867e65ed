"""The compiled engine: which path runs a repeated call's node-local steps, and why.

The package builds a small C extension (``collectives._engine``, from
``collectives/_engine.c``) when it is installed where a C compiler is found. It
runs a repeated allreduce's node-local steps in one call instead of dozens of
interpreter calls: a small one's copy in, posted signature, shared-memory barrier,
signatures' check and reduction (``SmallAllreduce``, with the call's bookkeeping in
``LeanCore`` on the communicator's per-call state, ``WatchdogCore``), and a larger
one's segments, barrier for barrier as the Python path runs them
(``SegmentedAllreduce``); and in other modes of the small call a repeated small
reduce-scatter, all-gather, broadcast, reduce and barrier. The algorithms stay
schedules, and what the engine does not take (other dtypes and ops, other
transports) runs the Python path, which gives the same bits. ``COLLECTIVES_COMPILED=0`` turns it off (the
Python path runs everything); ``COLLECTIVES_COMPILED=1`` asks for it, and a
communicator made where it was not built raises (as it does for a value that is
neither).
"""

__all__ = [
    "COMPILED",
    "DONE",
    "FINISH",
    "FLAG",
    "LATE",
    "MISMATCH",
    "NOT_TAKEN",
    "LeanCore",
    "WatchdogCore",
    "compiled",
    "reduces",
    "why",
]

import importlib
import threading
from types import ModuleType
from typing import TYPE_CHECKING, Any

from ._env import env_flag
from .errors import ConfigurationError

FLAG = "COLLECTIVES_COMPILED"

DONE, LATE, MISMATCH = 0, 1, 2
"""What a compiled call's ``run`` returns: done; a rank is late (wait on, then reduce); signatures differ."""
NOT_TAKEN, FINISH = -1, 3
"""What a :class:`LeanCore`'s ``start`` returns besides: nothing done; done but for the call's end."""


_NEWEST = "repeat_barrier"
"""The engine's newest call: a build without it is from an older source, and is not used."""


def _load() -> tuple[ModuleType | None, str, ConfigurationError | None]:
    """The extension where it runs, why it runs or not, and the setting's error (``compiled`` raises it)."""
    try:  # by name: an optional extension module, not one of the package's Python modules
        _engine = importlib.import_module(f"{__package__}._engine")
    except ImportError as error:
        built: ModuleType | None = None
        reason = f"the Python path: the compiled engine was not built ({error})"
    else:
        built, reason = _engine, f"compiled ({_engine.__file__})"
        if not hasattr(_engine, _NEWEST):  # built from an older source: its calls are not this code's
            built = None
            reason = (
                f"the Python path: the compiled engine {_engine.__file__} is older than its source: "
                "rebuild it (pip install -e .)"
            )
    try:
        wanted = env_flag(FLAG)
    except ConfigurationError as error:
        return None, f"the Python path: {error}", error
    if wanted is False:
        return None, f"the Python path: {FLAG}=0", None
    if wanted and built is None:
        problem = ConfigurationError(
            f"{FLAG}=1 asks for the compiled engine, but it was not built: reinstall the package where "
            "a C compiler is found (pip install -e . builds it), or unset the variable"
        )
        return None, f"the Python path: {problem}", problem
    return built, reason, None


COMPILED, _WHY, _PROBLEM = _load()
_BUILT = COMPILED  # the module whose LeanCore is the base (COMPILED may be set to None later, by tests)


def compiled() -> bool:
    """Whether the compiled engine runs (it was built, and ``COLLECTIVES_COMPILED`` is not 0).

    Raises:
        ConfigurationError: ``COLLECTIVES_COMPILED`` is unusable, or asks for an engine not built.
    """
    if _PROBLEM is not None:
        raise _PROBLEM
    return COMPILED is not None


def why() -> str:
    """Which path runs and why, in words (for ``python -m collectives info``)."""
    return _WHY


def reduces(dtype: str, op: str) -> bool:
    """Whether the compiled engine reduces ``dtype`` with ``op`` (numpy names) with numpy's bits."""
    return COMPILED is not None and bool(COMPILED.reduces(dtype, op))


class _PythonLeanCore:
    """:class:`LeanCore` where the engine does not run: the same fields, and a start that takes no call."""

    __slots__ = (
        "_barriers",
        "_began",
        "_call",
        "_check",
        "_entry",
        "_kernel",
        "_posted",
        "_sequence",
        "_tag",
        "_tracer",
        "_turn",
        "averages",
        "executor",
        "guard",
        "watchdog",
    )

    _barriers: int
    _began: float
    _call: Any
    _check: bool | None
    _entry: Any
    _kernel: Any
    _posted: int
    _sequence: int
    _tag: bytes | None
    _tracer: Any
    _turn: int
    averages: bool
    executor: Any
    guard: Any
    watchdog: Any

    def start(self, work: Any, source: Any) -> int:
        """Take no call: the Python path runs it."""
        return NOT_TAKEN


if TYPE_CHECKING:
    LeanCore = _PythonLeanCore
else:
    LeanCore = _PythonLeanCore if _BUILT is None else _BUILT.LeanCore
"""The base of :class:`~collectives.lean.LeanAllreduce`: the engine's (whose ``start`` runs a repeated
small allreduce's bookkeeping and compiled call in one call) where it runs, else a Python one whose
``start`` takes no call. A call takes the engine only where its compiled call was made (``_kernel``)."""


class _PythonWatchdogCore:
    """:class:`WatchdogCore` where the engine was not built: the same fields, as plain attributes."""

    def __init__(self) -> None:
        self._claim = threading.Lock()

    def take_claim(self) -> bool:
        """Whether this call took the communicator's claim (never waits)."""
        return self._claim.acquire(False)

    def give_claim(self) -> None:
        """Give the claim back."""
        self._claim.release()

    def claim_held(self) -> bool:
        """Whether some call holds the claim."""
        return self._claim.locked()

    sequence: int
    claimed_by: int
    last_began: float
    late_after: float
    broken: str | None
    check: bool
    tag: bytes
    recorder: Any


if TYPE_CHECKING:
    WatchdogCore = _PythonWatchdogCore
else:
    WatchdogCore = _PythonWatchdogCore if _BUILT is None else _BUILT.WatchdogCore
"""The base of :class:`~collectives.watchdog.Watchdog`: where the engine was built, its fields a repeated
call reads and writes (sequence number, claim holder, last call's start, late check interval, broken,
check, tag, flight recorder) live in a struct the compiled start reaches directly; Python reads and
writes them as attributes either way. The communicator's claim is its flag, taken by compare-and-swap
(``take_claim``), or a lock's where the engine was not built: atomic with or without the GIL, so of
two threads exactly one gets it."""
