"""Horovod's PyTorch API with Horovod's semantics: ``import collectives.horovod as hvd`` in a Horovod script.

As in Horovod, reductions average by default (``op=Average``; the library's
own ``collectives.torch_integration`` sums by default), the ``*_async*``
functions return an integer handle for :func:`poll` and :func:`synchronize`,
and collectives are matched across ranks by ``name``, so ranks may start them
in different orders; unnamed ones are named by their order (``allreduce.noname.3``),
so unnamed collectives must be started in the same order on every rank.
Everything runs on the default communicator, over ``MPI.COMM_WORLD`` (or the
communicator given to :func:`init`); process sets other than the global one
are not offered. See the README's "For Horovod users" for what differs.
"""

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "allgather",
    "allgather_async",
    "allgather_object",
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
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "init",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "nccl_built",
    "poll",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "shutdown",
    "size",
    "synchronize",
]

import io
import itertools
import pickle
import socket
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import torch

from .errors import CollectivesError, ConfigurationError, InvalidBufferError
from .torch_integration import collective_jobs as jobs
from .torch_integration.compression import Compression
from .torch_integration.elastic import Elastic, HostsUpdatedInterrupt
from .torch_integration.horovod_optimizer import distributed_optimizer
from .torch_integration.mpi_ops import communicator_for
from .torch_integration.named import named_ops
from .torch_integration.sync_batch_norm import SyncBatchNorm
from .torch_integration.tensors import FALLBACK, check_tensor, route_of
from .torch_integration.worker import background_worker

Average, Sum, Adasum, Min, Max, Product = range(6)
"""The reduction ops, as Horovod's constants."""
_OPS = {Average: "avg", Sum: "sum", Adasum: "adasum", Min: "min", Max: "max", Product: "prod"}

HorovodInternalError = CollectivesError
"""What a failed collective raises: every error of this library is one."""

global_process_set = None
"""The only process set: all ranks (pass ``process_set=`` only as this, or leave it out)."""


class _State:
    def __init__(self) -> None:
        self.comm: Any = None
        self.initialized = False
        self.local: tuple[int, int, int, int] = (0, 1, 0, 1)  # local rank, local size, cross rank, cross size


_state = _State()
_unnamed: dict[str, "itertools.count[int]"] = {}  # each kind's unnamed collectives, counted in program order
_handles: dict[int, tuple["Future[Any]", Callable[[Any], Any], str]] = {}  # and each one's full name
_handle_ids = itertools.count(1)


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start (a collective call): ``comm`` is an mpi4py communicator, or ``None`` for ``COMM_WORLD``."""
    if process_sets not in (None, [], "dynamic"):
        raise ConfigurationError("collectives.horovod runs on the global process set only")
    _state.comm = comm
    elastic.enter(comm)  # a process started in a lost rank's place joins the job here
    communicator = communicator_for(comm)
    worker = background_worker(communicator)
    hosts = worker.submit(
        lambda: jobs.allgather_bytes(socket.gethostname().encode(), worker.communicator)
    ).result()
    order = list(dict.fromkeys(hosts))  # nodes in the order of their first rank
    mine = hosts[communicator.rank]
    on_node = [r for r, host in enumerate(hosts) if host == mine]
    _state.local = (on_node.index(communicator.rank), len(on_node), order.index(mine), len(order))
    _state.initialized = True


def _new_world() -> None:
    """After a lost rank (elastic), the survivors' world: as ``shutdown(); init()``."""
    _handles.clear()  # the lost world's, never to complete
    _unnamed.clear()  # each survivor may have named a different number of them
    init(_state.comm)


elastic = Elastic(_new_world, lambda: _state.comm)
"""Horovod Elastic, ``@hvd.elastic.run`` and ``TorchState``: :mod:`collectives.torch_integration.elastic`."""


def shutdown() -> None:
    """Stop: later calls need :func:`init` again. Collectives in flight finish first."""
    for handle in list(_handles):
        synchronize(handle)
    _state.initialized = False


def is_initialized() -> bool:
    """Whether :func:`init` was called (and not :func:`shutdown` since)."""
    return _state.initialized


def _communicator() -> Any:
    if not _state.initialized:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return communicator_for(_state.comm)


def rank() -> int:
    """This process's rank."""
    return int(_communicator().rank)


def size() -> int:
    """The number of ranks."""
    return int(_communicator().size)


def local_rank() -> int:
    """This process's rank among the ranks of its node (host name)."""
    _communicator()
    return _state.local[0]


def local_size() -> int:
    """The number of ranks on this process's node."""
    _communicator()
    return _state.local[1]


def cross_rank() -> int:
    """This process's node's index among the nodes, in the order of their first rank."""
    _communicator()
    return _state.local[2]


def cross_size() -> int:
    """The number of nodes."""
    _communicator()
    return _state.local[3]


def mpi_built() -> bool:
    """True: collectives runs over MPI."""
    return True


def mpi_enabled() -> bool:
    """True: collectives runs over MPI."""
    return True


def gloo_built() -> bool:
    """False: no Gloo controller here."""
    return False


def gloo_enabled() -> bool:
    """False: no Gloo controller here."""
    return False


def nccl_built() -> bool:
    """False: GPU reductions here go through CuPy, not a Horovod NCCL build."""
    return False


def cuda_built() -> bool:
    """Whether torch has CUDA."""
    return bool(torch.cuda.is_available())


def _op_of(op: int | None, average: bool | None) -> int:
    """Horovod's rule: ``op`` wins, ``average`` is deprecated, Average by default."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        if op not in _OPS:
            raise ValueError(f"unknown op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product")
        return op
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return Average if average else Sum
    return Average


def _global(process_set: Any) -> None:
    if process_set is not None:
        raise ConfigurationError("collectives.horovod runs on the global process set only")


def _name(kind: str, name: str | None) -> str:
    if name is not None:
        return f"{kind}.{name}"
    counter = _unnamed.setdefault(kind, itertools.count())
    return f"{kind}.noname.{next(counter)}"


def _start(
    kind: str, name: str | None, tensors: Sequence[torch.Tensor], job: Callable[[Any], Any],
    finish: Callable[[Any], Any] = lambda result: result,
) -> int:  # fmt: skip
    """Start the named collective ``job`` after checking ``tensors``; its handle.

    Where this rank's checks fail the collective still takes its place, to tell
    the other ranks (theirs raise ``PeerInputError``), and this rank raises.
    """
    communicator = _communicator()
    full = _name(kind, name)
    if name is not None and any(entry[2] == full for entry in _handles.values()):  # as Horovod refuses
        raise ConfigurationError(f"a {kind} named {name!r} is in flight already: synchronize it first")
    try:
        for tensor in tensors:
            check_tensor(tensor)
            if route_of(tensor, None) == FALLBACK:
                raise InvalidBufferError("collectives.horovod takes cuda tensors only with CuPy installed")
    except Exception as error:
        named_ops(communicator).refuse(full, kind, error)
        raise
    future = named_ops(communicator).submit(full, job)
    handle = next(_handle_ids)
    _handles[handle] = (future, finish, full)
    return handle


def poll(handle: int) -> bool:
    """Whether the collective of ``handle`` has finished; then :func:`synchronize` returns at once."""
    if handle not in _handles:
        raise ValueError(f"unknown handle {handle!r}: it was never returned, or was synchronized already")
    return _handles[handle][0].done()


def synchronize(handle: int) -> Any:
    """Wait for the collective of ``handle``; its output (``None`` for a handle already synchronized)."""
    entry = _handles.pop(handle, None)
    if entry is None:
        return None
    future, finish, _ = entry
    return finish(future.result())


def _reduction(
    op: int, tensors: Sequence[torch.Tensor], prescale: float, postscale: float
) -> Callable[[Any], Any]:
    kind = _OPS[op]
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
    _global(process_set)
    job = _reduction(_op_of(op, average), [tensor], prescale_factor, postscale_factor)
    return _start("allreduce", name, [tensor], job, lambda _: tensor)


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


def _apply(function: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    result: torch.Tensor = function.apply(*args)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    return result


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: int, name: str | None, pre: float, post: float) -> Any:
        ctx.op, ctx.pre, ctx.post = op, pre, post
        return synchronize(
            allreduce_async(tensor, name=name, op=op, prescale_factor=pre, postscale_factor=post)
        )

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=ctx.op, prescale_factor=ctx.pre, postscale_factor=ctx.post)
        return reduced, None, None, None, None


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
    _global(process_set)
    chosen = _op_of(op, average)
    compressed, ctx = compression.compress(tensor)
    reduced = _apply(_Allreduce, compressed, chosen, name, prescale_factor, postscale_factor)
    result: torch.Tensor = compression.decompress(reduced, ctx)
    return result


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor], average: bool | None = None, name: str | None = None,
    op: int | None = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
    process_set: Any = None,
) -> int:  # fmt: skip
    """Start reducing every tensor of ``tensors`` in place, as one collective (fused by dtype); a handle."""
    _global(process_set)
    group = list(tensors)
    job = _reduction(_op_of(op, average), group, prescale_factor, postscale_factor)
    return _start("grouped_allreduce", name, group, job, lambda _: group)


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
    _global(process_set)
    return _start("allgather", name, [tensor], lambda comm: jobs.allgather_rows(tensor, comm))


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None) -> Any:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        return synchronize(allgather_async(tensor, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=Average)  # Horovod averages here
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64))
        start = int(rows[: rank()].sum())
        return reduced.narrow(0, start, ctx.rows), None


def allgather(tensor: torch.Tensor, name: str | None = None, process_set: Any = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension, in rank order; differentiable."""
    _global(process_set)
    return _apply(_Allgather, tensor, name)


def broadcast_async_(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> int:
    """Start copying the root's ``tensor`` into every rank's ``tensor``; a handle."""
    _global(process_set)
    return _start("broadcast", name, [tensor], lambda comm: jobs.broadcast_in_place(tensor, root_rank, comm))


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


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None) -> Any:
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        reduced = allreduce(grad.contiguous(), op=Average)  # as Horovod: the average, on the root only
        if rank() != ctx.root_rank:
            reduced = reduced * 0
        return reduced, None, None


def broadcast(
    tensor: torch.Tensor, root_rank: int, name: str | None = None, process_set: Any = None
) -> torch.Tensor:
    """The root's ``tensor`` on every rank, in a new tensor; differentiable."""
    _global(process_set)
    return _apply(_Broadcast, tensor, root_rank, name)


def alltoall_async(
    tensor: torch.Tensor, splits: Any = None, name: str | None = None, process_set: Any = None
) -> int:
    """Start sending ``splits[j]`` rows of ``tensor`` to rank j; a handle to (rows, received splits)."""
    _global(process_set)
    counts = (
        None if splits is None else [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
    )
    return _start("alltoall", name, [tensor], lambda comm: jobs.alltoall_splits(tensor, counts, comm))


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
    _global(process_set)
    kind = _OPS[_op_of(op, None)]
    if kind == "adasum":
        raise NotImplementedError("reducescatter does not take Adasum")
    return _start(
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
    _global(process_set)
    synchronize(_start("barrier", None, [], lambda comm: jobs.barrier(comm)))


def join(device: int = -1) -> int:
    """Wait until every rank has joined; the rank that joined last.

    Unlike Horovod, ranks that joined do not stand in (with zeros) for the
    collectives the others go on starting: call it after the same collectives on every rank.
    """
    stamp = time.time()

    def job(comm: Any) -> int:
        stamps = [float(s) for s in jobs.allgather_bytes(repr(stamp).encode(), comm)]
        return max(range(len(stamps)), key=lambda r: (stamps[r], r))

    return synchronize(_start("join", None, [], job))  # type: ignore[no-any-return]


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """The root's ``obj`` (pickled) on every rank."""
    _global(process_set)
    payload = pickle.dumps(obj) if rank() == root_rank else b""
    data = synchronize(
        _start("broadcast_object", name, [], lambda comm: jobs.broadcast_bytes(payload, root_rank, comm))
    )
    return obj if rank() == root_rank else pickle.loads(data)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order."""
    _global(process_set)
    payload = pickle.dumps(obj)
    every = synchronize(
        _start("allgather_object", name, [], lambda comm: jobs.allgather_bytes(payload, comm))
    )
    return [pickle.loads(data) for data in every]


def broadcast_parameters(params: Any, root_rank: int) -> None:
    """Copy the root's parameters into every rank's: ``model.state_dict()`` or ``named_parameters()``.

    Each tensor is broadcast under its name, so ranks may list them in any order.
    """
    if isinstance(params, Mapping):
        items = sorted(params.items())
    elif isinstance(params, Iterable):
        items = list(params)
        if items and not all(isinstance(item, tuple) and len(item) == 2 for item in items):
            raise ValueError("broadcast_parameters takes a dict or a list of (name, tensor) pairs")
    else:
        raise ValueError(f"invalid params of type {type(params).__name__}")
    handles = []
    with torch.no_grad():
        for name, tensor in items:
            handles.append(broadcast_async_(tensor.data if tensor.requires_grad else tensor, root_rank, name))
    for handle in handles:
        synchronize(handle)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int) -> None:
    """Give every rank the root's optimizer state (``state_dict()``) and hyperparameters."""
    buffer = io.BytesIO()
    if rank() == root_rank:
        torch.save(optimizer.state_dict(), buffer)
    data = broadcast_object(buffer.getvalue(), root_rank, name="optimizer_state")
    if rank() != root_rank:
        optimizer.load_state_dict(torch.load(io.BytesIO(data), weights_only=True))


_COMPRESSIONS: dict[Any, str | None] = {Compression.none: None, Compression.fp16: "fp16"}


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer, named_parameters: Any = None, compression: Any = Compression.none,
    backward_passes_per_step: int = 1, op: int = Average, gradient_predivide_factor: float = 1.0,
    num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False, process_set: Any = None,
) -> torch.optim.Optimizer:  # fmt: skip
    """Wrap ``optimizer`` so that ``step()`` first averages the gradients over the ranks, as Horovod's.

    Returns an instance of ``optimizer``'s own class (a subclass made for it)
    sharing its parameter groups and state, with ``synchronize()`` and
    ``skip_synchronize()``. Gradients are reduced in fusion buckets while
    backward runs. ``op``: Average, Sum or Adasum (each rank steps, then the
    parameter changes are combined by Adasum). ``gradient_predivide_factor``
    f: gradients are divided by f before the sum and by size/f after.
    Sparse gradients travel dense whatever ``sparse_as_dense`` says (the same average).
    """
    _global(process_set)
    if compression not in _COMPRESSIONS:
        raise ValueError("compression must be hvd.Compression.none or hvd.Compression.fp16")
    del sparse_as_dense  # gradients are made dense in any case
    world = size()
    if op == Adasum and world & (world - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    return distributed_optimizer(
        optimizer, named_parameters, op=_OPS.get(op, str(op)), compression=_COMPRESSIONS[compression],
        backward_passes_per_step=backward_passes_per_step,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
        comm=_state.comm,
    )  # fmt: skip
