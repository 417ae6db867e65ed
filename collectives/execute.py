"""Runs one rank's part of a schedule over a transport, on an array backend."""

__all__ = ["execute", "scratch_elements"]

from typing import Any

from .backends.base import ArrayBackend
from .ops import ReduceOp
from .schedule import Schedule
from .transport.base import Transport

TAG = 7
"""Tag of every library message: the transport's communicator is the library's own,
and both sides post a step's messages in schedule order, so order alone matches them."""


def scratch_elements(schedule: Schedule, rank: int) -> int:
    """Elements of scratch ``rank`` needs: the most it receives for reduction in one step."""
    sizes = schedule.chunk_sizes
    return max(
        (sum(sizes[t.into] for t in step.recvs if t.reduce) for step in schedule.program(rank)),
        default=0,
    )


def execute(
    schedule: Schedule,
    transport: Transport,
    backend: ArrayBackend,
    buffer: Any,
    op: ReduceOp | None = None,
    scratch: Any = None,
) -> None:
    """Run ``transport.rank``'s part of ``schedule`` on ``buffer`` in place.

    Args:
        schedule: the schedule; its world size must be the transport's.
        transport: this rank's transport.
        backend: the backend of ``buffer``.
        buffer: this rank's 1-D contiguous buffer of ``schedule.count`` elements.
        op: the reduction, for schedules that reduce.
        scratch: a buffer of at least ``scratch_elements(schedule, rank)``
            elements; allocated here when omitted.
    """
    rank = transport.rank
    program = schedule.program(rank)
    bounds = schedule.chunk_bounds
    if scratch is None:
        scratch = backend.empty(scratch_elements(schedule, rank), buffer)
    for step in program:
        requests = []
        pending = []
        used = 0
        # empty chunks are skipped on both sides alike, so messages still pair up
        for t in step.recvs:
            lo, hi = bounds[t.into], bounds[t.into + 1]
            if lo == hi:
                continue
            if t.reduce:
                landing = scratch[used : used + hi - lo]
                used += hi - lo
                pending.append((buffer[lo:hi], landing))
            else:
                landing = buffer[lo:hi]
            requests.append(transport.irecv(backend.message(landing), t.src, TAG))
        for t in step.sends:
            lo, hi = bounds[t.chunk], bounds[t.chunk + 1]
            if lo != hi:
                requests.append(transport.isend(backend.message(buffer[lo:hi]), t.dst, TAG))
        transport.waitall(requests)
        if pending:
            if op is None:
                raise ValueError(f"{schedule.name} reduces, so it needs an op")
            for target, landing in pending:
                backend.combine(op, target, landing)
