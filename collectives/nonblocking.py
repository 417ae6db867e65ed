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

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import api
from .communicator import Communicator
from .ops import ReduceOp
from .requests import Request, start
from .selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI


def iallreduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.allreduce`; ``wait()`` returns its result (``out`` when given).

    Arguments as for :func:`~collectives.allreduce`; ``x`` and ``out`` must stay untouched until ``wait()``.
    """
    return start(
        comm,
        "allreduce",
        lambda group: api.allreduce(x, op, out=out, algorithm=algorithm, comm=group, check=check),
    )


def ireduce_scatter(
    x: Any,
    op: "str | ReduceOp" = "sum",
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.reduce_scatter`; ``wait()`` returns this rank's share.

    Arguments as for :func:`~collectives.reduce_scatter`.
    """
    return start(
        comm,
        "reduce_scatter",
        lambda group: api.reduce_scatter(
            x, op, counts=counts, out=out, algorithm=algorithm, comm=group, check=check
        ),
    )


def iallgather(
    x: Any,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.allgather`; ``wait()`` returns the concatenation.

    Arguments as for :func:`~collectives.allgather`.
    """
    return start(
        comm,
        "allgather",
        lambda group: api.allgather(x, counts=counts, out=out, algorithm=algorithm, comm=group, check=check),
    )


def ibroadcast(
    x: Any,
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.broadcast`; ``wait()`` returns the root's data.

    Arguments as for :func:`~collectives.broadcast`.
    """
    return start(
        comm,
        "broadcast",
        lambda group: api.broadcast(x, root, out=out, algorithm=algorithm, comm=group, check=check),
    )


def ireduce(
    x: Any,
    op: "str | ReduceOp" = "sum",
    root: int = 0,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.reduce`; ``wait()`` returns the result at the root, ``None`` elsewhere.

    Arguments as for :func:`~collectives.reduce`.
    """
    return start(
        comm,
        "reduce",
        lambda group: api.reduce(x, op, root, out=out, algorithm=algorithm, comm=group, check=check),
    )


def igather(
    x: Any,
    root: int = 0,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.gather`; ``wait()`` returns the concatenation at the root, else ``None``.

    Arguments as for :func:`~collectives.gather`.
    """
    return start(
        comm,
        "gather",
        lambda group: api.gather(
            x, root, counts=counts, out=out, algorithm=algorithm, comm=group, check=check
        ),
    )


def iscatter(
    x: Any,
    root: int = 0,
    *,
    counts: Sequence[int] | None = None,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.scatter`; ``wait()`` returns this rank's share.

    Arguments as for :func:`~collectives.scatter`.
    """
    return start(
        comm,
        "scatter",
        lambda group: api.scatter(
            x, root, counts=counts, out=out, algorithm=algorithm, comm=group, check=check
        ),
    )


def ialltoall(
    x: Any,
    *,
    out: Any = None,
    algorithm: str = AUTO,
    comm: "Communicator | MPI.Comm | None" = None,
    check: bool | None = None,
) -> Request:
    """Start :func:`~collectives.alltoall`; ``wait()`` returns the shares from every rank.

    Arguments as for :func:`~collectives.alltoall`.
    """
    return start(
        comm, "alltoall", lambda group: api.alltoall(x, out=out, algorithm=algorithm, comm=group, check=check)
    )


def ibarrier(
    comm: "Communicator | MPI.Comm | None" = None, *, algorithm: str = AUTO, check: bool | None = None
) -> Request:
    """Start :func:`~collectives.barrier`; ``wait()`` returns ``None`` once every rank has called it."""
    return start(comm, "barrier", lambda group: api.barrier(group, algorithm=algorithm, check=check))
