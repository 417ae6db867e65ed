"""A repeated call's one call from the api into the compiled engine, for the collectives but allreduce.

The twins of the engine's ``repeat_in_place`` and ``repeat_out_of_place`` (an allreduce's, called
from the api itself).

Each finds the call's kept repeat by its key as :func:`collectives.repeats.find_repeat` makes it, checks
its arrays as the repeat's ``fits`` and ``run`` would, and runs the lean path's start, whose small call
does the call's copies, signed barrier and reduction in C; a late rank's wait or differing signatures go
on in Python (``LeanShared.went_on``). Where the engine does not take a call, nothing was done and the
caller takes the full path (:func:`collectives.dispatch.call_collective`).
"""

__all__ = ["ELSEWHERE", "repeat_barrier", "repeat_rooted", "repeat_shares"]

from typing import Any

import numpy as np

from . import engine
from .communicator import Communicator, communicator_of
from .requests import busy, settle

_EMPTY, _EMPTY_LIKE = np.empty, np.empty_like
ELSEWHERE = object()
"""What :func:`repeat_rooted` gives a reduce's rank other than its root: done, and no result there."""
_NOTHING = bytearray()  # a barrier's input and output in the compiled engine: no bytes


def repeat_shares(
    collective: str, x: Any, out: Any, op: Any, counts: Any, algorithm: str, comm: Any, check: bool | None
) -> Any:
    """A repeated reduce-scatter's or all-gather's call in one call into the compiled engine; None: not taken.

    For numpy arrays (``out`` too, or None) and no average (whose repeat divides after).
    """
    group, compiled = _group(comm)
    done = compiled.repeat_shares(group.repeats, collective, x, out, op, counts, algorithm, check, _EMPTY)
    return done if done is None or done.__class__ is not tuple else _went_on(done)


def repeat_rooted(
    collective: str, x: Any, out: Any, op: Any, root: Any, algorithm: str, comm: Any, check: bool | None
) -> Any:
    """A repeated broadcast's or reduce's call in one call into the compiled engine; None: not taken.

    A reduce's rank other than its root gets :data:`ELSEWHERE` (the caller returns None there).
    """
    group, compiled = _group(comm)
    done = compiled.repeat_rooted(group.repeats, collective, x, out, op, root, algorithm, check, _EMPTY_LIKE)
    if done is not None and done.__class__ is tuple:
        done = _went_on(done)
    return ELSEWHERE if done is not None and collective == "reduce" and group.rank != root else done


def repeat_barrier(algorithm: str, comm: Any, check: bool | None) -> bool:
    """A repeated barrier in one call into the compiled engine; whether it was taken."""
    group, compiled = _group(comm)
    done = compiled.repeat_barrier(group.repeats, algorithm, check, _NOTHING)
    return done is not None and (done.__class__ is not tuple or _went_on(done) is not None)


def _group(comm: Any) -> tuple[Communicator, Any]:
    """The call's communicator, its started calls settled first, and the engine (the callers ask for it)."""
    if busy:
        settle(comm)
    compiled = engine.COMPILED
    assert compiled is not None
    return (comm if comm.__class__ is Communicator else communicator_of(comm)), compiled


def _went_on(started: tuple[Any, int, Any]) -> Any:
    """The result of a call the engine started: the Python path goes on with it; None where not taken."""
    lean, status, result = started
    if status == engine.NOT_TAKEN:
        return None
    lean.went_on(status, result)
    return result
