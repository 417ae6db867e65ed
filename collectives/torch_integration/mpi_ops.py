"""Horovod-style functions on tensors, and the communicator lookup and checks that every call begins with."""

__all__ = [
    "Handle",
    "allgather",
    "allreduce",
    "allreduce_",
    "allreduce_async_",
    "broadcast_",
    "broadcast_async_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "rank",
    "reduce_scatter",
    "size",
]

import functools
import hashlib
import io
import math
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import Any, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from .. import api
from ..communicator import communicator_of
from ..dispatch import checked
from ..errors import CollectivesError, ConfigurationError, InvalidBufferError, MismatchError
from ..ops import get_op
from .collective_jobs import broadcast_bytes
from .process_group.backend import BACKEND, MPIProcessGroup
from .tensors import (
    FALLBACK,
    TORCH_DTYPES,
    TORCH_OPS,
    Comm,
    array_view,
    check_tensor,
    cuda_without_cupy,
    device_of,
    reduce_in_place,
    route_of,
)
from .worker import background_worker

T = TypeVar("T")

# torch 2.13 renamed the one-tensor all-gather and reduce-scatter (the old names warn there);
# torch before it has only the old names
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def communicator_for(comm: Comm) -> api.Communicator:
    """The library's communicator for ``comm``, which may also be a torch.distributed group of this backend.

    ``None`` is the communicator over ``MPI.COMM_WORLD`` (created on first use,
    a collective call), not torch's default group.
    """
    if isinstance(comm, MPIProcessGroup):
        return comm.communicator
    if isinstance(comm, dist.ProcessGroup):
        raise ConfigurationError(
            f"comm is a torch.distributed group of the {comm.name()!r} backend; collectives runs on the "
            f"groups of the {BACKEND!r} backend (torch.distributed.new_group(ranks, backend={BACKEND!r}))"
        )
    if isinstance(comm, int) and comm == dist.GroupMember.NON_GROUP_MEMBER:
        raise ConfigurationError("comm is GroupMember.NON_GROUP_MEMBER: this rank is not in that group")
    return communicator_of(comm)


def submit_job(comm: Comm, job: Callable[[api.Communicator], T]) -> "Future[T]":
    """Run ``job(communicator)`` on the communicator's thread.

    The communicator is looked up (and the default one created, a collective
    call) here, on the caller's thread.
    """
    worker = background_worker(communicator_for(comm))
    return worker.submit(lambda: job(worker.communicator))


def checked_on(comm: Comm, collective: str, checks: Callable[[], T], tensor: object = None) -> T:
    """``checks()``, a torch call's checks on the caller's thread; if they raise, the other ranks are told.

    The news goes on the communicator's thread, after the collectives started
    before (see :func:`collectives.dispatch.checked`), and their ``collective``
    raises :class:`~collectives.PeerInputError`. Nothing is told where there is
    no communicator of this library to tell (a ``comm`` of another backend), nor
    for a cuda ``tensor`` without CuPy, whose collectives go through
    torch.distributed's NCCL group: the other ranks then wait until their timeout.
    """

    def place(news: Callable[[api.Communicator], None]) -> None:
        if cuda_without_cupy(tensor):
            return
        try:
            communicator = communicator_for(comm)
        except CollectivesError:
            return
        background_worker(communicator).run_in_order(news, collective)

    return checked(None, collective, checks, place=place)


def checked_call(tensor: torch.Tensor, op: str | None, comm: Comm, collective: str) -> str:
    """Validate ``tensor`` and ``op`` before any rank communicates (see :func:`checked_on`); the route."""
    return checked_on(comm, collective, lambda: _route(tensor, op, comm), tensor)


def _route(tensor: torch.Tensor, op: str | None, comm: Comm) -> str:
    name = check_tensor(tensor)
    if op is not None:
        get_op(op).check_dtype(name)
    return route_of(tensor, comm)


def rank(comm: Comm = None) -> int:
    """This process's rank in ``comm`` (over ``MPI.COMM_WORLD`` by default), as Horovod's ``rank()``."""
    return communicator_for(comm).rank


def size(comm: Comm = None) -> int:
    """The number of ranks in ``comm`` (over ``MPI.COMM_WORLD`` by default), as Horovod's ``size()``."""
    return communicator_for(comm).size


class Handle:
    """A collective in flight, from :func:`allreduce_async_`; :meth:`wait` gives its result."""

    __slots__ = ("_done", "_wait")

    def __init__(self, wait: Callable[[float | None], torch.Tensor], done: Callable[[], bool]) -> None:
        self._wait = wait
        self._done = done

    def done(self) -> bool:
        """Whether the collective has finished, successfully or not."""
        return self._done()

    def wait(self, timeout: float | None = None) -> torch.Tensor:
        """Block until the collective finishes; return its result, or raise its error.

        Args:
            timeout: the most seconds to wait (then ``TimeoutError``); ``None``
                waits as long as it takes. The NCCL fallback ignores it.
        """
        return self._wait(timeout)


def _work_handle(work: dist.Work | None, tensor: torch.Tensor) -> Handle:
    """A handle on torch.distributed's work on ``tensor``."""
    if work is None:
        raise CollectivesError("torch.distributed gave no work to wait on")

    def wait(timeout: float | None) -> torch.Tensor:
        work.wait()
        return tensor

    return Handle(wait, work.is_completed)


def allreduce_async_(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> Handle:
    """Start reducing ``tensor`` in place across all ranks; :meth:`Handle.wait` returns it.

    Leave the tensor alone until the handle is waited on. The collectives of
    one communicator run in the order they were started, on a background
    thread, so every rank must start them in the same order.

    Args:
        tensor: a contiguous cpu tensor, the same shape and dtype on every
            rank; a cuda one goes through CuPy zero-copy, or torch.distributed's
            NCCL where CuPy is missing (see :func:`~collectives.torch_integration.explain_path`).
        op: ``sum``, ``prod``, ``min``, ``max``, ``avg`` (floating types) or
            ``band``, ``bor``, ``bxor`` (integers).
        comm: a :class:`~collectives.Communicator`, an mpi4py communicator,
            or a torch.distributed group of the ``collectives`` backend; the
            communicator over ``MPI.COMM_WORLD`` by default.
    """
    if checked_call(tensor, op, comm, "allreduce") == FALLBACK:
        return _work_handle(dist.all_reduce(tensor, op=TORCH_OPS[get_op(op).name], async_op=True), tensor)
    future = submit_job(comm, lambda communicator: reduce_in_place(tensor, op, communicator))
    return Handle(future.result, future.done)


def allreduce_(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """Reduce ``tensor`` in place across all ranks and return it; as :func:`allreduce_async_`."""
    return allreduce_async_(tensor, op, comm=comm).wait()


def allreduce(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """The reduction of ``tensor`` across all ranks, in a new tensor; ``tensor`` is left as it was.

    Args as for :func:`allreduce_async_`.
    """
    checked_call(tensor, op, comm, "allreduce")
    return allreduce_(tensor.detach().clone(), op, comm=comm)


def allgather(tensor: torch.Tensor, *, comm: Comm = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order, in a new tensor.

    As in Horovod, the first dimension may differ between ranks (the row
    counts are exchanged first); the other dimensions and the dtype must be the
    same on every rank. A 0-d tensor counts as one row.
    """
    route = checked_call(tensor, None, comm, "allgather")
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    layout = [rows.shape[0], math.prod(rows.shape[1:]), rows.dim(), list(TORCH_DTYPES).index(tensor.dtype)]
    if route == FALLBACK:
        return _fallback_allgather(rows, layout)

    def job(communicator: api.Communicator) -> torch.Tensor:
        layouts = api.allgather(np.array(layout, np.int64), comm=communicator).reshape(-1, len(layout))
        _check_layouts(layouts, tuple(rows.shape[1:]))
        out = torch.empty(
            (int(layouts[:, 0].sum()), *rows.shape[1:]), dtype=tensor.dtype, device=tensor.device
        )
        counts = [int(n) * layout[1] for n in layouts[:, 0]]
        with device_of(out):
            mine, whole = array_view(rows).reshape(-1), array_view(out).reshape(-1)
            api.allgather(mine, counts=counts, out=whole, comm=communicator)
        return out

    return submit_job(comm, job).result()


def _check_layouts(layouts: np.ndarray, rest: tuple[int, ...]) -> None:
    """Raise, on every rank alike, unless all ranks' rows have the same size, rank and dtype."""
    if (layouts[:, 1:] != layouts[0, 1:]).any():
        raise InvalidBufferError(
            "allgather needs the same dtype and trailing dimensions on every rank; ranks differ in "
            f"(elements per row, dimensions, dtype): {[tuple(int(v) for v in row[1:]) for row in layouts]}"
        )


def _fallback_allgather(rows: torch.Tensor, layout: list[int]) -> torch.Tensor:
    size = dist.get_world_size()
    mine = torch.tensor(layout, dtype=torch.int64, device=rows.device)
    layouts = torch.empty(size * len(layout), dtype=torch.int64, device=rows.device)
    _all_gather_single(layouts, mine)
    table = layouts.reshape(size, len(layout)).cpu().numpy()
    _check_layouts(table, tuple(rows.shape[1:]))
    parts = [rows.new_empty((int(n), *rows.shape[1:])) for n in table[:, 0]]
    dist.all_gather(parts, rows)
    return torch.cat(parts)


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """This rank's share of the reduction of ``tensor`` across all ranks, in a new tensor.

    ``tensor`` has ``P * k`` rows (P the world size); rank ``r`` gets rows
    ``r * k`` to ``(r + 1) * k`` of the reduction.
    """
    route = checked_call(tensor, op, comm, "reduce_scatter")
    checked_on(comm, "reduce_scatter", lambda: _with_rows(tensor), tensor)
    if route == FALLBACK:
        size = dist.get_world_size()
        out = tensor.new_empty((tensor.shape[0] // size, *tensor.shape[1:]))
        _reduce_scatter_single(out, tensor, op=TORCH_OPS[get_op(op).name])
        return out

    def job(communicator: api.Communicator) -> torch.Tensor:
        out = tensor.new_empty((tensor.shape[0] // communicator.size, *tensor.shape[1:]))
        with device_of(out):
            api.reduce_scatter(array_view(tensor), op, out=array_view(out), comm=communicator)
        return out

    return submit_job(comm, job).result()


def _with_rows(tensor: torch.Tensor) -> None:
    if tensor.dim() == 0:
        raise InvalidBufferError("reduce_scatter needs a tensor with rows, got a 0-d tensor")


def broadcast_async_(tensor: torch.Tensor, root_rank: int = 0, *, comm: Comm = None) -> Handle:
    """Start copying the root's ``tensor`` into every rank's ``tensor``; :meth:`Handle.wait` returns it.

    Args:
        tensor: a contiguous cpu tensor of the same shape and dtype on every
            rank (a cuda one as for :func:`allreduce_async_`); only the root's
            contents are read.
        root_rank: the rank whose tensor is sent.
        comm: the communicator, as for :func:`allreduce_async_`.
    """
    if checked_call(tensor, None, comm, "broadcast") == FALLBACK:
        return _work_handle(dist.broadcast(tensor, src=root_rank, async_op=True), tensor)

    def job(communicator: api.Communicator) -> torch.Tensor:
        with device_of(tensor):
            view = array_view(tensor)
            api.broadcast(view, root_rank, out=view, comm=communicator)
        return tensor

    future = submit_job(comm, job)
    return Handle(future.result, future.done)


def broadcast_(tensor: torch.Tensor, root_rank: int = 0, *, comm: Comm = None) -> torch.Tensor:
    """Copy the root's ``tensor`` into every rank's ``tensor`` and return it; as :func:`broadcast_async_`."""
    return broadcast_async_(tensor, root_rank, comm=comm).wait()


def broadcast_parameters(
    params: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]] | Iterable[torch.Tensor],
    root_rank: int = 0,
    *,
    comm: Comm = None,
) -> None:
    """Copy the root's parameters (and buffers) into every rank's, in place, so all ranks start equal.

    Args:
        params: ``model.state_dict()`` or ``model.named_parameters()``, matched
            between ranks by name, or a list of tensors, in the same order on every rank.
        root_rank: the rank whose values are sent.
        comm: the communicator, as for :func:`allreduce_async_`.

    Raises:
        MismatchError: the ranks name different tensors (on every rank).
    """
    if isinstance(params, Mapping):
        named = sorted(params.items(), key=lambda item: item[0])
    else:
        named = [item if isinstance(item, tuple) else (f"tensor {i}", item) for i, item in enumerate(params)]
        named.sort(key=lambda item: item[0])
    for name, tensor in named:
        checked_on(comm, "broadcast", functools.partial(_parameter, name, tensor, comm), tensor)
    _agree_on_names([name for name, _ in named], comm)
    with torch.no_grad():
        # the first alone, so that where another rank's checks failed (and it told this one in the
        # first broadcast's place) no more broadcasts are left waiting for it
        if named:
            broadcast_async_(named[0][1], root_rank, comm=comm).wait()
        handles = [broadcast_async_(tensor, root_rank, comm=comm) for _, tensor in named[1:]]
    for handle in handles:
        handle.wait()


def _parameter(name: str, tensor: object, comm: Comm) -> None:
    """Raise unless the parameter ``name`` is a tensor ``broadcast_`` takes."""
    if not isinstance(tensor, torch.Tensor):
        raise InvalidBufferError(f"broadcast_parameters takes tensors; {name} is {type(tensor).__name__}")
    _route(tensor, None, comm)


def _agree_on_names(names: list[str], comm: Comm) -> None:
    """Raise :class:`MismatchError` on every rank unless all ranks pass the same names."""
    communicator = communicator_for(comm)
    if communicator.size == 1:
        return
    digest = np.frombuffer(hashlib.sha256("\0".join(names).encode()).digest()[:16], np.uint8).copy()
    every = background_worker(communicator).submit(lambda: api.allgather(digest, comm=communicator)).result()
    digests = [bytes(every[16 * r : 16 * (r + 1)]).hex() for r in range(communicator.size)]
    if len(set(digests)) > 1:
        by_digest: dict[str, tuple[int, ...]] = {}
        for r, d in enumerate(digests):
            by_digest[d] = (*by_digest.get(d, ()), r)
        differ = [r for r, d in enumerate(digests) if d != digests[0]]
        raise MismatchError(
            f"broadcast_parameters: ranks {differ} name other tensors than rank 0 ({len(names)} names here)",
            {"names": by_digest},
        )


def broadcast_optimizer_state(
    optimizer: torch.optim.Optimizer, root_rank: int = 0, *, comm: Comm = None
) -> None:
    """Give every rank the root's optimizer state (moments, step counts) and hyperparameters.

    The root's ``state_dict()`` is serialised with ``torch.save``, broadcast as
    bytes, and loaded into every other rank's optimizer, which must hold the
    same parameters in the same groups.
    """
    future = submit_job(comm, lambda communicator: _broadcast_state(optimizer, root_rank, communicator))
    state = future.result()
    if state is not None:
        optimizer.load_state_dict(state)


def _broadcast_state(
    optimizer: torch.optim.Optimizer, root_rank: int, communicator: api.Communicator
) -> dict[str, Any] | None:
    """The root's state dict on the other ranks, ``None`` on the root; on the communication thread."""
    payload = b""
    if communicator.rank == root_rank:
        buffer = io.BytesIO()
        torch.save(optimizer.state_dict(), buffer)
        payload = buffer.getvalue()
    received = broadcast_bytes(payload, root_rank, communicator)
    if communicator.rank == root_rank:
        return None
    loaded: dict[str, Any] = torch.load(io.BytesIO(received), weights_only=True)
    return loaded
