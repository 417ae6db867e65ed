"""torch through collectives: Horovod-style API, DDP hooks, a torch.distributed backend, KVStoreOptimizer."""

from . import functional
from .checkpoint import load_training, restore_training, save_training, training_state
from .hooks import allreduce_bf16_hook, allreduce_fp16_hook, allreduce_hook
from .kvstore_optimizer import KVStoreOptimizer, server_optimizer_of
from .mpi_ops import (
    Handle,
    allgather,
    allreduce,
    allreduce_,
    allreduce_async_,
    broadcast_,
    broadcast_async_,
    broadcast_optimizer_state,
    broadcast_parameters,
    rank,
    reduce_scatter,
    size,
)
from .optimizer import DistributedOptimizer, fusion_buckets
from .process_group import BACKEND, RENDEZVOUS
from .reproducible import ReproducibleGradients, reproducible_allreduce_hook
from .tensors import explain_path

__all__ = [
    "BACKEND",
    "RENDEZVOUS",
    "DistributedOptimizer",
    "Handle",
    "KVStoreOptimizer",
    "ReproducibleGradients",
    "allgather",
    "allreduce",
    "allreduce_",
    "allreduce_async_",
    "allreduce_bf16_hook",
    "allreduce_fp16_hook",
    "allreduce_hook",
    "broadcast_",
    "broadcast_async_",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "explain_path",
    "functional",
    "fusion_buckets",
    "load_training",
    "rank",
    "reduce_scatter",
    "reproducible_allreduce_hook",
    "restore_training",
    "save_training",
    "server_optimizer_of",
    "size",
    "training_state",
]
