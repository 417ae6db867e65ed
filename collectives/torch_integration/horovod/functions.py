"""Horovod's functions over its collectives: objects, a model's parameters and an optimizer's state."""

__all__ = ["allgather_object", "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters"]

import io
import pickle
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import collective_jobs as jobs
from .basics import check_global, rank
from .ops import broadcast_async_, start, synchronize


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None, process_set: Any = None) -> Any:
    """The root's ``obj`` (pickled) on every rank."""
    check_global(process_set)
    payload = pickle.dumps(obj) if rank() == root_rank else b""
    data = synchronize(
        start("broadcast_object", name, [], lambda comm: jobs.broadcast_bytes(payload, root_rank, comm))
    )
    return obj if rank() == root_rank else pickle.loads(data)


def allgather_object(obj: Any, name: str | None = None, process_set: Any = None) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order."""
    check_global(process_set)
    payload = pickle.dumps(obj)
    every = synchronize(start("allgather_object", name, [], lambda comm: jobs.allgather_bytes(payload, comm)))
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
