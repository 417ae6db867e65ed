"""Horovod's tensor collectives: named, started on the communication thread, waited on by handle."""

__all__ = [
    "allgather",
    "allgather_async",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "join",
    "poll",
    "reducescatter",
    "reducescatter_async",
    "start",
    "synchronize",
]

import itertools
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ...dispatch import checked
from ...errors import ConfigurationError, InvalidBufferError
from .. import collective_jobs as jobs
from ..autograd import REDUCED, Allreduce, Collective, Reduction, differentiate
from ..named import named_ops
from ..tensors import FALLBACK, check_tensor, route_of
from .basics import (
    OPS,
    Average,
    check_global,
    horovod_communicator,
    op_of,
    rank,
    size,
    state,
)
from .compression import Compression


def _name(kind: str, name: str | None) -> str:
    if name is not None:
        return f"{kind}.{name}"
    counter = state.unnamed.setdefault(kind, itertools.count())
    return f"{kind}.noname.{next(counter)}"


def start(
    kind: str, name: str | None, tensors: Sequence[torch.Tensor], job: Callable[[Any], Any],
    finish: Callable[[Any], Any] = lambda result: result,
) -> int:  # fmt: skip
    """Start the named collective ``job`` after checking ``tensors``; its handle.

    Where this rank's checks fail the collective still takes its place, to tell
    the other ranks (theirs raise ``PeerInputError``), and this rank raises.
    """
    communicator = horovod_communicator()
    full = _name(kind, name)
    if name is not None and any(entry[2] == full for entry in state.handles.values()):  # as Horovod refuses
        raise ConfigurationError(f"a {kind} named {name!r} is in flight already: synchronize it first")
    named = named_ops(communicator)
    # a refusal takes the collective's place under its name
    checked(None, kind, lambda: _check_tensors(tensors), place=lambda news: named.submit(full, news))
    future = named.submit(full, job)
    handle = next(state.handle_ids)
    state.handles[handle] = (future, finish, full)
    return handle


def _check_tensors(tensors: Sequence[torch.Tensor]) -> None:
    for tensor in tensors:
        check_tensor(tensor)
        if route_of(tensor, None) == FALLBACK:
            raise InvalidBufferError("collectives.horovod takes cuda tensors only with CuPy installed")


def poll(handle: int) -> bool:
    """Whether the collective of ``handle`` has finished; then :func:`synchronize` returns at once."""
    if handle not in state.handles:
        raise ValueError(f"unknown handle {handle!r}: it was never returned, or was synchronized already")
    return state.handles[handle][0].done()


def synchronize(handle: int) -> Any:
    """Wait for the collective of ``handle``; its output (``None`` for a handle already synchronized)."""
    entry = state.handles.pop(handle, None)
    if entry is None:
        return None
    future, finish, _ = entry
    return finish(future.result())


def _reduction(
    op: int, tensors: Sequence[torch.Tensor], prescale: float, postscale: float
) -> Callable[[Any], Any]:
    kind = OPS[op]
    if kind == "adasum":
        world = size()
        if world & (world - 1):
            raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    return lambda comm: jobs.allreduce_scaled_(tensors, kind, prescale, postscale, comm)


def allreduce_async_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> int:  # fmt: skip
    """Start reducing ``tensor`` in place over the ranks (``op``, Average by default); a handle."""
    check_global(process_set)
    job = _reduction(op_of(op, average), [tensor], prescale_factor, postscale_factor)
    return start("allreduce", name, [tensor], job, lambda _: tensor)


def allreduce_async(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> int:  # fmt: skip
    """Start reducing a copy of ``tensor``; :func:`synchronize` returns the result, ``tensor`` stays."""
    return allreduce_async_(
        tensor.detach().clone(), average, name, op, prescale_factor, postscale_factor, process_set
    )


def allreduce_(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> torch.Tensor:  # fmt: skip
    """Reduce ``tensor`` in place over the ranks and return it."""
    handle = allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    result: torch.Tensor = synchronize(handle)
    return result


def allreduce(
    tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
    compression: Any = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> torch.Tensor:  # fmt: skip
    """The reduction of ``tensor`` over the ranks, in a new tensor: ``postscale * op(prescale * x)``.

    ``op`` is Average (the default), Sum, Min, Max, Product or Adasum (floating
    tensors, a power of two of ranks). Differentiable: the gradient is reduced
    with the same op, as in Horovod.
    """
    check_global(process_set)
    chosen = op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    pre, post = prescale_factor, postscale_factor
    reduction = Reduction(
        lambda t: synchronize(
            allreduce_async(t, name=name, op=chosen, prescale_factor=pre, postscale_factor=post)
        ),
        REDUCED,  # as Horovod: the gradient is reduced with the forward's op and scaling
        reduce_gradient=lambda g: allreduce(g, op=chosen, prescale_factor=pre, postscale_factor=post),
    )
    reduced = differentiate(Allreduce, compressed, reduction)
    result: torch.Tensor = compression.decompress(reduced, ctx)
    return result


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = None,
) -> int:  # fmt: skip
    """Start reducing every tensor of ``tensors`` in place, as one collective (fused by dtype); a handle."""
    check_global(process_set)
    group = list(tensors)
    job = _reduction(op_of(op, average), group, prescale_factor, postscale_factor)
    return start("grouped_allreduce", name, group, job, lambda _: group)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = None,
) -> int:  # fmt: skip
    """Start reducing copies of ``tensors``; :func:`synchronize` returns the list of results."""
    copies = [t.detach().clone() for t in tensors]
    return grouped_allreduce_async_(copies, average, name, op, prescale_factor, postscale_factor, process_set)


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = None,
) -> list[torch.Tensor]:  # fmt: skip
    """Reduce every tensor of ``tensors`` in place; the list of them."""
    handle = grouped_allreduce_async_(
        tensors, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return synchronize(handle)  # type: ignore[no-any-return]


def grouped_allreduce(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    compression: Any = Compression.none, op: int | None = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0, process_set: Any = None,
) -> list[torch.Tensor]:  # fmt: skip
    """The reductions of every tensor of ``tensors``, in new tensors, as one collective."""
    pairs = [compression.compress(t) for t in tensors]
    handle = grouped_allreduce_async(
        [t for t, _ in pairs], average, name, op, prescale_factor, postscale_factor, process_set
    )
    reduced = synchronize(handle)
    return [compression.decompress(t, ctx) for t, (_, ctx) in zip(reduced, pairs, strict=True)]


def allgather_async(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> int:
    """Start concatenating every rank's ``tensor`` along the first dimension (which may differ); a handle."""
    check_global(process_set)
    return start("allgather", name, [tensor], lambda comm: jobs.allgather_rows(tensor, comm))


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order; differentiable."""
    check_global(process_set)
    rows = tensor.shape[0] if tensor.dim() else 1

    def gradient(grad: torch.Tensor) -> torch.Tensor:
        reduced = allreduce(grad, op=Average)  # Horovod averages here
        counts = allgather(torch.tensor([rows], dtype=torch.int64))
        return reduced.narrow(0, int(counts[: rank()].sum()), rows)

    return differentiate(Collective, tensor, lambda t: synchronize(allgather_async(t, name)), gradient)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> int:
    """Start copying the root's ``tensor`` into every rank's ``tensor``; a handle."""
    check_global(process_set)
    return start("broadcast", name, [tensor], lambda comm: jobs.broadcast_in_place(tensor, root_rank, comm))


def broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> int:
    """Start broadcasting the root's ``tensor`` into a new tensor; :func:`synchronize` returns it."""
    return broadcast_async_(tensor.detach().clone(), root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """Copy the root's ``tensor`` into every rank's ``tensor`` and return it."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))  # type: ignore[no-any-return]


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """The root's ``tensor`` on every rank, in a new tensor; differentiable."""
    check_global(process_set)

    def gradient(grad: torch.Tensor) -> torch.Tensor:
        reduced = allreduce(grad, op=Average)  # as Horovod: the average, on the root only
        return reduced if rank() == root_rank else reduced * 0

    return differentiate(
        Collective, tensor, lambda t: synchronize(broadcast_async(t, root_rank, name)), gradient
    )


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None
) -> int:
    """Start sending ``splits[j]`` rows of ``tensor`` to rank j; a handle to (rows, received splits)."""
    check_global(process_set)
    counts = (
        None if splits is None else [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
    )
    return start("alltoall", name, [tensor], lambda comm: jobs.alltoall_splits(tensor, counts, comm))


def alltoall(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None
) -> Any:
    """Rows received from every rank, in rank order; with ``splits``, also how many came from each."""
    out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def reducescatter_async(
    tensor: torch.Tensor, name: str | None = None, op: int = Average, process_set: Any = None,
    prescale_factor: float = 1.0, postscale_factor: float = 1.0,
) -> int:  # fmt: skip
    """Start reducing ``tensor`` over the ranks, each keeping its rows; a handle.

    Rows are split as Horovod splits them: the first ``rows % size`` ranks get one more.
    """
    check_global(process_set)
    kind = OPS[op_of(op, None)]
    if kind == "adasum":
        raise NotImplementedError("reducescatter does not take Adasum")
    return start(
        "reducescatter", name, [tensor],
        lambda comm: jobs.reducescatter_rows(tensor, kind, prescale_factor, postscale_factor, comm),
    )  # fmt: skip


def reducescatter(
    tensor: torch.Tensor, name: str | None = None, compression: Any = Compression.none, op: int = Average,
    process_set: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
) -> torch.Tensor:  # fmt: skip
    """This rank's rows of the reduction of ``tensor`` over the ranks (Average by default)."""
    compressed, ctx = compression.compress(tensor)
    handle = reducescatter_async(compressed, name, op, process_set, prescale_factor, postscale_factor)
    return compression.decompress(synchronize(handle), ctx)  # type: ignore[no-any-return]


def barrier(process_set: Any = None) -> None:
    """Return once every rank has called it."""
    check_global(process_set)
    synchronize(start("barrier", None, [], lambda comm: jobs.barrier(comm)))


def join(device: int = -1) -> int:
    """Wait until every rank has joined; the rank that joined last.

    Unlike Horovod, ranks that joined do not stand in (with zeros) for the
    collectives the others go on starting: call it after the same collectives on every rank.
    """
    stamp = time.time()

    def job(comm: Any) -> int:
        stamps = [float(s) for s in jobs.allgather_bytes(repr(stamp).encode(), comm)]
        return max(range(len(stamps)), key=lambda r: (stamps[r], r))

    return synchronize(start("join", None, [], job))  # type: ignore[no-any-return]
