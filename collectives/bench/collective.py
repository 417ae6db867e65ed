"""Timing and checking one collective under MPI, a table row at a time."""

__all__ = ["COLLECTIVES", "library_version", "mpi_datatype", "run", "unavailable"]

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
from collectives.explanation import Explanation
from collectives.selector import AUTO, default_selector
from collectives.specs import get_spec

from .config import MPI_ALGORITHM, Settings, plan_sizes
from .patterns import ExactData, count_wrong, numpy_dtype
from .report import Row, Timing, bandwidths, format_footer, format_header, format_row

# the MPI datatype of each dtype, by attribute name; ones this MPI lacks are null
_MPI_TYPES = {
    "float16": "FLOAT16_T", "bfloat16": "BFLOAT16_T", "float32": "FLOAT", "float64": "DOUBLE",
    "int8": "INT8_T", "int16": "INT16_T", "int32": "INT32_T", "int64": "INT64_T",
    "uint8": "UINT8_T", "uint16": "UINT16_T", "uint32": "UINT32_T", "uint64": "UINT64_T",
}  # fmt: skip

# MPI has no average: the mpi baseline sums, then divides like the library does
_MPI_OPS = {
    "sum": "SUM", "avg": "SUM", "prod": "PROD", "min": "MIN", "max": "MAX",
    "band": "BAND", "bor": "BOR", "bxor": "BXOR",
}  # fmt: skip


def library_version() -> str:
    """The first line of the MPI library's version, its runs of spaces collapsed."""
    lines = MPI.Get_library_version().strip().splitlines() or ["unknown"]
    return " ".join(lines[0].split())


def mpi_datatype(dtype: str) -> MPI.Datatype | None:
    """The MPI datatype of a dtype name; ``None`` where this MPI library has none."""
    datatype = getattr(MPI, _MPI_TYPES[dtype], MPI.DATATYPE_NULL)
    return None if datatype == MPI.DATATYPE_NULL else datatype


def unavailable(settings: Settings) -> dict[str, str]:
    """Why each algorithm asked for cannot run here, by name; empty when all can."""
    moves_data = get_spec(settings.collective).carries_data
    if MPI_ALGORITHM in settings.algorithms and moves_data and mpi_datatype(settings.dtype) is None:
        return {MPI_ALGORITHM: f"this MPI library has no {settings.dtype} datatype"}
    return {}


@dataclass(frozen=True)
class _Context:
    """What every measurement of a run shares."""

    settings: Settings
    world: MPI.Intracomm  # the benchmark's own traffic: timings and counts
    comm: collectives.Communicator
    dtype: np.dtype

    def message(self, array: np.ndarray) -> list[Any]:
        """An explicit MPI buffer spec; raw bytes, since numpy cannot export every dtype."""
        return [array.view(np.uint8), mpi_datatype(self.settings.dtype)]

    def op(self) -> str:
        """The run's reduction; only the collectives that reduce ask for it."""
        if self.settings.op is None:
            raise ValueError(f"{self.settings.collective} has no op")
        return self.settings.op

    def mpi_op(self) -> MPI.Op:
        """The MPI op of the run's reduction."""
        op: MPI.Op = getattr(MPI, _MPI_OPS[self.op()])
        return op

    def root(self) -> int:
        """The run's root; only the rooted collectives ask for it."""
        if self.settings.root is None:
            raise ValueError(f"{self.settings.collective} has no root")
        return self.settings.root

    def at_root(self) -> bool:
        """Whether this rank is the run's root."""
        return self.world.rank == self.root()


@dataclass(frozen=True)
class _Case:
    """The buffers of one measured call, and the call.

    Attributes:
        buffers: every buffer the call touches, poisoned before each initialisation.
        source: where this rank's input goes.
        result: where this rank's result lands.
        call: runs the collective once.
    """

    buffers: tuple[np.ndarray, ...]
    source: np.ndarray
    result: np.ndarray
    call: Callable[[], object]


def _averaged(ctx: _Context, call: Callable[[], object], result: np.ndarray) -> Callable[[], object]:
    """``call``, followed by the division by P that the MPI library cannot do for avg."""
    if ctx.settings.op != "avg":
        return call

    def run() -> None:
        call()
        np.true_divide(result, ctx.world.size, out=result)

    return run


def _allreduce_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Allreduce of ``count`` elements; in place, the result overwrites the input."""
    x = np.empty(count, ctx.dtype)
    out = x if in_place else np.empty_like(x)
    if algorithm == MPI_ALGORITHM:
        send = MPI.IN_PLACE if in_place else ctx.message(x)
        mpi_call = partial(ctx.world.Allreduce, send, ctx.message(out), op=ctx.mpi_op())
        call = _averaged(ctx, mpi_call, out)
    else:
        call = partial(collectives.allreduce, x, ctx.op(), out=out, algorithm=algorithm, comm=ctx.comm)
    return _Case((x, out), x, out, call)


def _reduce_scatter_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Reduce-scatter of ``count`` input elements; in place, the share lands inside the input."""
    share = count // ctx.world.size
    x = np.empty(count, ctx.dtype)
    # in place, the library leaves this rank's share where it sits in x; MPI puts it first
    lo = 0 if algorithm == MPI_ALGORITHM else ctx.world.rank * share
    out = x[lo : lo + share] if in_place else np.empty(share, ctx.dtype)
    buffers = (x,) if in_place else (x, out)
    if algorithm == MPI_ALGORITHM:
        send = MPI.IN_PLACE if in_place else ctx.message(x)
        recv = ctx.message(x if in_place else out)
        mpi_call = partial(ctx.world.Reduce_scatter_block, send, recv, op=ctx.mpi_op())
        return _Case(buffers, x, out, _averaged(ctx, mpi_call, out))
    call = partial(collectives.reduce_scatter, x, ctx.op(), out=out, algorithm=algorithm, comm=ctx.comm)
    return _Case(buffers, x, out, call)


def _allgather_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Allgather into ``count`` output elements; in place, the input is this rank's slot of the output."""
    share = count // ctx.world.size
    out = np.empty(count, ctx.dtype)
    lo = ctx.world.rank * share
    x = out[lo : lo + share] if in_place else np.empty(share, ctx.dtype)
    buffers = (out,) if in_place else (x, out)
    if algorithm == MPI_ALGORITHM:
        send = MPI.IN_PLACE if in_place else ctx.message(x)
        call: Callable[[], object] = partial(ctx.world.Allgather, send, ctx.message(out))
    else:
        call = partial(collectives.allgather, x, out=out, algorithm=algorithm, comm=ctx.comm)
    return _Case(buffers, x, out, call)


def _broadcast_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Broadcast of ``count`` elements from the root; in place, the root's input is everyone's output."""
    root = ctx.root()
    x = np.empty(count, ctx.dtype)
    out = x if in_place else np.empty_like(x)
    if algorithm != MPI_ALGORITHM:
        call = partial(collectives.broadcast, x, root, out=out, algorithm=algorithm, comm=ctx.comm)
        return _Case((x, out), x, out, call)

    def mpi_call() -> None:
        # MPI broadcasts in place; out of place the root first copies its input, as the library does
        if not in_place and ctx.at_root():
            np.copyto(out, x)
        ctx.world.Bcast(ctx.message(out), root=root)

    return _Case((x, out), x, out, mpi_call)


def _reduce_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Reduce of ``count`` elements to the root; in place, the root's result overwrites its input."""
    root = ctx.root()
    x = np.empty(count, ctx.dtype)
    out = x if in_place else np.empty_like(x)
    if algorithm != MPI_ALGORITHM:
        call = partial(collectives.reduce, x, ctx.op(), root, out=out, algorithm=algorithm, comm=ctx.comm)
        return _Case((x, out), x, out, call)
    # the receive buffer means something only at the root
    send = MPI.IN_PLACE if in_place and ctx.at_root() else ctx.message(x)
    recv = ctx.message(out) if ctx.at_root() else None
    mpi_call = partial(ctx.world.Reduce, send, recv, op=ctx.mpi_op(), root=root)
    return _Case((x, out), x, out, _averaged(ctx, mpi_call, out) if ctx.at_root() else mpi_call)


def _whole_and_share(ctx: _Context, count: int, in_place: bool) -> tuple[np.ndarray, np.ndarray]:
    """A buffer of ``count`` elements and this rank's share of it: its slot of that buffer where in place."""
    share = count // ctx.world.size
    whole = np.empty(count, ctx.dtype)
    lo = ctx.world.rank * share
    return whole, whole[lo : lo + share] if in_place else np.empty(share, ctx.dtype)


def _gather_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Gather into ``count`` elements at the root; in place, each input is its rank's slot of the output."""
    root = ctx.root()
    out, x = _whole_and_share(ctx, count, in_place)
    buffers = (out,) if in_place else (x, out)
    if algorithm != MPI_ALGORITHM:
        call = partial(collectives.gather, x, root, out=out, algorithm=algorithm, comm=ctx.comm)
        return _Case(buffers, x, out, call)
    if ctx.at_root():
        send = MPI.IN_PLACE if in_place else ctx.message(x)
        mpi_call = partial(ctx.world.Gather, send, ctx.message(out), root=root)
    else:
        mpi_call = partial(ctx.world.Gather, ctx.message(x), None, root=root)
    return _Case(buffers, x, out, mpi_call)


def _scatter_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Scatter of the root's ``count`` elements; in place, each share lands in its slot of the input."""
    root = ctx.root()
    x, out = _whole_and_share(ctx, count, in_place)
    buffers = (x,) if in_place else (x, out)
    if algorithm != MPI_ALGORITHM:
        # only the root has data; the others give their share's shape by out= alone
        source = x if ctx.at_root() else None
        call = partial(collectives.scatter, source, root, out=out, algorithm=algorithm, comm=ctx.comm)
        return _Case(buffers, x, out, call)
    if ctx.at_root():
        recv = MPI.IN_PLACE if in_place else ctx.message(out)
        mpi_call = partial(ctx.world.Scatter, ctx.message(x), recv, root=root)
    else:
        mpi_call = partial(ctx.world.Scatter, None, ctx.message(out), root=root)
    return _Case(buffers, x, out, mpi_call)


def _alltoall_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """Alltoall of ``count`` elements per rank, a share for each; in place, over the input."""
    x = np.empty(count, ctx.dtype)
    out = x if in_place else np.empty_like(x)
    if algorithm == MPI_ALGORITHM:
        send = MPI.IN_PLACE if in_place else ctx.message(x)
        call: Callable[[], object] = partial(ctx.world.Alltoall, send, ctx.message(out))
    else:
        call = partial(collectives.alltoall, x, out=out, algorithm=algorithm, comm=ctx.comm)
    return _Case((x, out), x, out, call)


def _barrier_case(ctx: _Context, algorithm: str, count: int, in_place: bool) -> _Case:
    """A barrier: no buffers, nothing to check."""
    nothing = np.empty(0, ctx.dtype)
    if algorithm == MPI_ALGORITHM:
        return _Case((), nothing, nothing, ctx.world.Barrier)
    return _Case((), nothing, nothing, partial(collectives.barrier, ctx.comm, algorithm=algorithm))


_CASES: dict[str, Callable[[_Context, str, int, bool], _Case]] = {
    "allreduce": _allreduce_case,
    "reduce_scatter": _reduce_scatter_case,
    "allgather": _allgather_case,
    "broadcast": _broadcast_case,
    "reduce": _reduce_case,
    "gather": _gather_case,
    "scatter": _scatter_case,
    "alltoall": _alltoall_case,
    "barrier": _barrier_case,
}
COLLECTIVES = tuple(_CASES)
"""The collectives this benchmark times."""


def _initialise(case: _Case, source: np.ndarray) -> None:
    """Poison every buffer of the case, then write this rank's input."""
    for buffer in case.buffers:
        # all ones is NaN, -1 or the largest unsigned value: never an expected element
        buffer.view(np.uint8).fill(0xFF)
    np.copyto(case.source, source)


def _seconds(ctx: _Context, case: _Case, source: np.ndarray) -> float:
    """The median over iterations of the slowest rank's time for one call."""
    _initialise(case, source)
    for _ in range(ctx.settings.warmup):
        case.call()
    times = np.empty(ctx.settings.iters)
    # start together once: a barrier in every iteration would hide the skew the collective leaves
    ctx.world.Barrier()
    for i in range(ctx.settings.iters):
        start = MPI.Wtime()
        case.call()
        times[i] = MPI.Wtime() - start
    ctx.world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    return float(np.median(times))


def _wrong(ctx: _Context, case: _Case, source: np.ndarray, expected: np.ndarray | None) -> int:
    """Elements that came out wrong on one fresh call, over all ranks; collective.

    A rank that gets no result (``expected`` is ``None``) counts none, but takes part.
    """
    _initialise(case, source)
    case.call()
    mine = 0 if expected is None else count_wrong(case.result, expected)
    return int(ctx.world.allreduce(mine, op=MPI.SUM))


def _explanation(ctx: _Context, count: int) -> Explanation:
    """What the selector predicts for this run's collective at ``count`` elements."""
    op = ctx.settings.op or "sum"  # the collectives that do not reduce ignore it
    return collectives.explain(ctx.settings.collective, count, ctx.settings.dtype, comm=ctx.comm, op=op)


def _row(ctx: _Context, algorithm: str, size: int, count: int, data: ExactData) -> Row:
    """Measure one size with one algorithm, out of place and in place (the barrier only once)."""
    rank, settings = ctx.world.rank, ctx.settings
    spec = get_spec(settings.collective)
    source = data.rank_input(rank, count)
    check = settings.check and spec.carries_data
    expected = data.expected(rank, count) if check else None
    factor = spec.busbw_factor(ctx.world.size)
    halves = []
    for in_place in (False, True) if spec.carries_data else (False,):
        case = _CASES[settings.collective](ctx, algorithm, count, in_place)
        seconds = _seconds(ctx, case, source)
        wrong = _wrong(ctx, case, source, expected) if check else None
        algbw, busbw = bandwidths(size, seconds, factor)
        halves.append(Timing(seconds * 1e6, algbw, busbw, wrong))
    # after the calls, so the label is the choice of the model the ranks agreed on
    label = f"{AUTO}:{_explanation(ctx, count).choice}" if algorithm == AUTO else algorithm
    in_place_half = halves[1] if len(halves) > 1 else None
    return Row(size, count, settings.dtype, settings.op or "none", label, halves[0], in_place_half)


def run(settings: Settings, world: MPI.Intracomm, emit: Callable[[str], None]) -> list[Row]:
    """Measure every size with every algorithm that can run, emitting the table as it goes.

    Args:
        settings: the run's options.
        world: the ranks to run over; collective, like everything here.
        emit: called with each line of the table, header and footer included.

    Returns:
        The rows, in the order emitted; the same on every rank.
    """
    notes = unavailable(settings)
    settings = replace(settings, algorithms=tuple(a for a in settings.algorithms if a not in notes))
    selecting = settings.explain or AUTO in settings.algorithms
    model = default_selector(world.size).model.describe() if selecting else None
    for line in format_header(settings, world.size, library_version(), notes, model):
        emit(line)
    dtype = numpy_dtype(settings.dtype)
    data = ExactData.of(settings.collective, settings.op, settings.dtype, world.size, settings.root or 0)
    comm = collectives.Communicator(world)
    if selecting:
        comm.features  # noqa: B018 - collective: set up shared memory now, so explanations see it
    ctx = _Context(settings, world, comm, dtype)
    rows = []
    try:
        for size, count in plan_sizes(settings.collective, settings.sizes, dtype.itemsize, world.size):
            if settings.explain:
                for line in str(_explanation(ctx, count)).splitlines():
                    emit(f"# {line}".rstrip())
            for algorithm in settings.algorithms:
                rows.append(_row(ctx, algorithm, size, count, data))
                emit(format_row(rows[-1]))
    finally:
        comm.free()
    for line in format_footer(rows):
        emit(line)
    return rows
