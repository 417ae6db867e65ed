"""The non-blocking collectives: each starts its blocking twin on the lane and returns a Request.

``iallreduce(x)`` returns at once; ``request.wait()`` returns what ``allreduce(x)``
would have, so computation placed between the two overlaps the communication.
Every rank must start its collectives, blocking or not, in the same order, as MPI
asks; the calls then run in that order on each communicator (see
:mod:`collectives.requests`). A blocking call made while started ones are still
running waits for them first. The arrays passed belong to the call until it
completes: change none of them (nor read ``out``) before ``wait()`` returns. Every
error of the call, its argument checks included, is raised by ``wait()`` (or by
``test()`` once it is done).
"""

__all__ = [
    "iallgather",
    "iallreduce",
    "ialltoall",
    "ibarrier",
    "ibroadcast",
    "igather",
    "ireduce",
    "ireduce_scatter",
    "iscatter",
]

import functools
import inspect
from collections.abc import Callable
from typing import Any, ParamSpec, cast

from . import api
from .requests import Request, start

P = ParamSpec("P")


def _started(blocking: Callable[P, Any]) -> Callable[P, Request]:
    """The non-blocking twin of ``blocking``: the same arguments, started on the communicator's lane."""
    name = blocking.__name__
    run = cast(Callable[..., Any], blocking)

    @functools.wraps(blocking)
    def begin(*args: P.args, **kwargs: P.kwargs) -> Request:
        given: dict[str, Any] = dict(kwargs)
        rest: tuple[Any, ...] = args
        if name == "barrier" and rest:  # barrier(comm) takes its communicator first
            given["comm"], rest = rest[0], rest[1:]
        comm = given.pop("comm", None)
        return start(comm, name, lambda group: run(*rest, comm=group, **given))

    begin.__name__ = begin.__qualname__ = f"i{name}"
    begin.__module__ = __name__
    begin.__doc__ = (
        f"Start :func:`~collectives.{name}`; ``wait()`` returns what it returns.\n\n"
        f"Arguments as for :func:`~collectives.{name}`; the arrays passed belong to the call until "
        "``wait()`` returns."
    )
    begin.__signature__ = inspect.signature(blocking).replace(return_annotation=Request)  # type: ignore[attr-defined]
    del begin.__wrapped__  # help() shows this signature, not the blocking one's
    return begin


iallreduce = _started(api.allreduce)
"""Start :func:`~collectives.allreduce`; ``wait()`` returns its result (``out`` when given)."""

ireduce_scatter = _started(api.reduce_scatter)
"""Start :func:`~collectives.reduce_scatter`; ``wait()`` returns this rank's share."""

iallgather = _started(api.allgather)
"""Start :func:`~collectives.allgather`; ``wait()`` returns the concatenation."""

ibroadcast = _started(api.broadcast)
"""Start :func:`~collectives.broadcast`; ``wait()`` returns the root's data."""

ireduce = _started(api.reduce)
"""Start :func:`~collectives.reduce`; ``wait()`` returns the result at the root, ``None`` elsewhere."""

igather = _started(api.gather)
"""Start :func:`~collectives.gather`; ``wait()`` returns the concatenation at the root, else ``None``."""

iscatter = _started(api.scatter)
"""Start :func:`~collectives.scatter`; ``wait()`` returns this rank's share."""

ialltoall = _started(api.alltoall)
"""Start :func:`~collectives.alltoall`; ``wait()`` returns the shares from every rank."""

ibarrier = _started(api.barrier)
"""Start :func:`~collectives.barrier`; ``wait()`` returns ``None`` once every rank has called it."""
