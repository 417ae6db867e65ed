"""The bodies of Horovod's collectives on tensors, run on the communication thread over one communicator."""

__all__ = [
    "allgather_bytes",
    "allgather_rows",
    "allreduce_scaled_",
    "alltoall_splits",
    "barrier",
    "broadcast_bytes",
    "broadcast_in_place",
    "reducescatter_rows",
    "reducescatter_shares",
]

from collections.abc import Sequence

import numpy as np
import torch

from .. import api
from ..errors import InvalidBufferError
from .adasum import adasum_allreduce_
from .tensors import TORCH_DTYPES, array_view, device_of, reduce_in_place


def _scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply in place; an integer tensor through float64, truncated toward zero (as Horovod)."""
    if factor == 1.0:
        return
    if tensor.dtype.is_floating_point:
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).trunc())


def _reduce_one_(tensor: torch.Tensor, op: str, communicator: api.Communicator) -> None:
    if op == "avg" and not tensor.dtype.is_floating_point:
        reduce_in_place(tensor, "sum", communicator)
        tensor.copy_(torch.div(tensor, communicator.size, rounding_mode="trunc"))
    else:
        reduce_in_place(tensor, op, communicator)


def allreduce_scaled_(
    tensors: Sequence[torch.Tensor],
    op: str,
    prescale: float,
    postscale: float,
    communicator: api.Communicator,
) -> None:
    """Reduce each tensor in place: ``postscale * op(prescale * x)`` over the ranks.

    ``op`` is ``avg``, ``sum``, ``min``, ``max``, ``prod`` or ``adasum``.
    Tensors of one dtype travel in one fused buffer.
    """
    for tensor in tensors:
        _scale_(tensor, prescale)
    if op == "adasum":
        adasum_allreduce_(tensors, communicator)
    elif len(tensors) == 1:
        _reduce_one_(tensors[0], op, communicator)
    else:
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for tensor in tensors:
            by_dtype.setdefault(tensor.dtype, []).append(tensor)
        for group in by_dtype.values():
            fused = torch.cat([t.reshape(-1) for t in group])
            _reduce_one_(fused, op, communicator)
            start = 0
            for tensor in group:
                tensor.copy_(fused[start : start + tensor.numel()].view_as(tensor))
                start += tensor.numel()
    for tensor in tensors:
        _scale_(tensor, postscale)


def _layouts(rows: torch.Tensor, communicator: api.Communicator) -> np.ndarray:
    """Every rank's (rows, elements per row, dimensions, dtype), one row per rank; the same on every rank."""
    layout = [rows.shape[0], int(np.prod(rows.shape[1:])), rows.dim(), list(TORCH_DTYPES).index(rows.dtype)]
    table = np.asarray(api.allgather(np.array(layout, np.int64), comm=communicator)).reshape(-1, 4)
    if (table[:, 1:] != table[0, 1:]).any():  # the same on every rank, so every rank raises
        raise InvalidBufferError(
            "the ranks' tensors differ in (elements per row, dimensions, dtype): "
            f"{[tuple(int(v) for v in row[1:]) for row in table]}; only the first dimension may differ"
        )
    return table


def allgather_rows(tensor: torch.Tensor, communicator: api.Communicator) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension (which may differ), in rank order."""
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    table = _layouts(rows, communicator)
    out = torch.empty((int(table[:, 0].sum()), *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    counts = [int(n * table[0, 1]) for n in table[:, 0]]
    with device_of(out):
        api.allgather(
            array_view(rows).reshape(-1), counts=counts, out=array_view(out).reshape(-1), comm=communicator
        )
    return out


def broadcast_in_place(tensor: torch.Tensor, root_rank: int, communicator: api.Communicator) -> torch.Tensor:
    """Copy the root's ``tensor`` into every rank's; return it."""
    with device_of(tensor):
        view = array_view(tensor)
        api.broadcast(view, root_rank, out=view, comm=communicator)
    return tensor


def alltoall_splits(
    tensor: torch.Tensor, splits: Sequence[int] | None, communicator: api.Communicator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Send rows ``splits[j]`` of ``tensor`` (in order) to rank j; the rows received, and how many from each.

    Without ``splits`` the first dimension is split evenly (it must divide).
    Shares of unequal sizes travel padded to the largest.
    """
    size = communicator.size
    rows = tensor.reshape(1) if tensor.dim() == 0 else tensor
    if splits is None:
        if rows.shape[0] % size:
            raise InvalidBufferError(
                f"alltoall without splits divides the first dimension ({rows.shape[0]}) by the world size "
                f"({size}); pass splits"
            )
        splits = [rows.shape[0] // size] * size
    splits = [int(s) for s in splits]
    if len(splits) != size or min(splits) < 0 or sum(splits) != rows.shape[0]:
        raise InvalidBufferError(
            f"alltoall splits {splits} must give {size} non-negative row counts summing to {rows.shape[0]}"
        )
    _layouts(rows, communicator)  # the same trailing shape and dtype everywhere
    table = np.asarray(api.allgather(np.array(splits, np.int64), comm=communicator)).reshape(size, size)
    received = table[:, communicator.rank].copy()
    widest = max(int(table.max()), 1)
    row_shape = rows.shape[1:]
    padded = rows.new_zeros((size * widest, *row_shape))
    start = 0
    for peer, count in enumerate(splits):
        padded[peer * widest : peer * widest + count] = rows[start : start + count]
        start += count
    with device_of(padded):
        view = array_view(padded)
        api.alltoall(view, out=view, comm=communicator)
    out = torch.cat([padded[peer * widest : peer * widest + int(n)] for peer, n in enumerate(received)])
    return out, torch.from_numpy(received.astype(np.int32))


def reducescatter_shares(rows: int, size: int) -> list[int]:
    """Horovod's split of ``rows`` over ``size`` ranks: the first ``rows % size`` ranks get one row more."""
    return [rows // size + (1 if rank < rows % size else 0) for rank in range(size)]


def reducescatter_rows(
    tensor: torch.Tensor, op: str, prescale: float, postscale: float, communicator: api.Communicator
) -> torch.Tensor:
    """This rank's rows of ``postscale * op(prescale * x)`` over the ranks (Horovod's split)."""
    if tensor.dim() == 0:
        raise InvalidBufferError("reducescatter needs a tensor with rows, got a 0-d tensor")
    work = tensor.detach().clone()
    _scale_(work, prescale)
    shares = reducescatter_shares(work.shape[0], communicator.size)
    per_row = int(np.prod(work.shape[1:]))
    out = work.new_empty((shares[communicator.rank], *work.shape[1:]))
    wire_op = "sum" if op == "avg" and not work.dtype.is_floating_point else op
    with device_of(work, out):
        api.reduce_scatter(
            array_view(work).reshape(-1), wire_op, counts=[n * per_row for n in shares],
            out=array_view(out).reshape(-1), comm=communicator,
        )  # fmt: skip
    if wire_op != op:
        out.copy_(torch.div(out, communicator.size, rounding_mode="trunc"))
    _scale_(out, postscale)
    return out


def barrier(communicator: api.Communicator) -> None:
    """Return once every rank has called it."""
    api.barrier(communicator)


def broadcast_bytes(payload: bytes, root_rank: int, communicator: api.Communicator) -> bytes:
    """The root's ``payload`` on every rank (the others pass anything): its length, then its bytes."""
    length = np.array([len(payload)], np.int64)
    api.broadcast(length, root_rank, out=length, comm=communicator)
    if communicator.rank == root_rank:
        data = np.frombuffer(payload, np.uint8).copy()
    else:
        data = np.empty(int(length[0]), np.uint8)
    api.broadcast(data, root_rank, out=data, comm=communicator)
    return data.tobytes()


def allgather_bytes(payload: bytes, communicator: api.Communicator) -> list[bytes]:
    """Every rank's ``payload``, in rank order."""
    lengths = np.asarray(api.allgather(np.array([len(payload)], np.int64), comm=communicator)).tolist()
    data = np.frombuffer(payload, np.uint8).copy()
    every = np.asarray(api.allgather(data, counts=lengths, comm=communicator))
    bounds = np.cumsum([0, *lengths])
    return [every[bounds[r] : bounds[r + 1]].tobytes() for r in range(len(lengths))]
