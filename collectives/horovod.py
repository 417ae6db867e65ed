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

This module only hands names on, as Horovod's ``horovod/torch/__init__.py``
does: the basics, ops, functions and optimizer live in
the sub-package ``collectives.torch_integration.horovod``.
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

from .torch_integration.horovod.basics import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    cross_rank,
    cross_size,
    cuda_built,
    elastic,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    nccl_built,
    rank,
    shutdown,
    size,
)
from .torch_integration.horovod.compression import Compression
from .torch_integration.horovod.elastic import HostsUpdatedInterrupt
from .torch_integration.horovod.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .torch_integration.horovod.ops import (
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    join,
    poll,
    reducescatter,
    reducescatter_async,
    synchronize,
)
from .torch_integration.horovod.optimizer import DistributedOptimizer
from .torch_integration.horovod.sync_batch_norm import SyncBatchNorm
