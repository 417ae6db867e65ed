"""Differentiable collectives on torch tensors: each backward is the collective that carries the gradient."""

__all__ = ["DIFFERENTIABLE_OPS", "allgather", "allreduce", "broadcast", "reduce_scatter"]

from typing import Any

import torch
import torch.distributed as dist

from .. import api
from ..errors import InvalidBufferError, UnsupportedOpError
from ..ops import get_op
from . import mpi_ops
from .autograd import HOLDERS, REDUCED, Allreduce, Collective, Reduction, differentiate
from .mpi_ops import checked_call, checked_on, submit_job
from .tensors import FALLBACK, Comm, array_view, device_of

DIFFERENTIABLE_OPS: dict[str, tuple[str, ...]] = {
    "allreduce": ("sum", "avg", "max", "min"),
    "reduce_scatter": ("sum", "avg"),
}
"""The ops each reducing collective differentiates; the others (prod, bitwise) have no gradient here."""

# The convention, as torch.distributed.nn's: the loss being differentiated is the sum of every
# rank's loss, so an input's gradient gathers what every rank's output sent back to it.


def _differentiable(collective: str, op: str, comm: Comm, tensor: torch.Tensor) -> str:
    """The op's canonical name; raises unless it is differentiable, telling the other ranks first."""
    return checked_on(comm, collective, lambda: _gradient_op(collective, op), tensor)


def _gradient_op(collective: str, op: str) -> str:
    name = get_op(op).name
    if name not in DIFFERENTIABLE_OPS[collective]:
        valid = ", ".join(DIFFERENTIABLE_OPS[collective])
        raise UnsupportedOpError(
            f"functional.{collective} has no gradient for op {name!r}; it differentiates {valid} "
            f"(torch_integration.{collective} reduces with {name!r} without a gradient)"
        )
    return name


def allreduce(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """The reduction of ``tensor`` across all ranks, in a new tensor that autograd differentiates.

    Backward reduces the gradient across the ranks again: for ``sum`` with a
    sum, for ``avg`` with an average. For ``max`` and ``min`` the summed
    gradient goes to the ranks holding the extreme value, shared evenly between
    ties, as :func:`torch.amax` does.

    Args:
        tensor: a contiguous tensor of the same shape and dtype on every rank,
            as for :func:`~collectives.torch_integration.allreduce`;
            ``requires_grad`` must be the same on every rank, since backward
            communicates.
        op: one of :data:`DIFFERENTIABLE_OPS` ``["allreduce"]``.
        comm: the communicator, as for :func:`~collectives.torch_integration.allreduce_async_`.

    Raises:
        UnsupportedOpError: for ``prod`` and the bitwise ops, before any data
            moves; a rank whose op is fine raises
            :class:`~collectives.PeerInputError` where another's is not.
    """
    name = _differentiable("allreduce", op, comm, tensor)
    reduction = Reduction(
        lambda t: mpi_ops.allreduce(t, name, comm=comm),
        HOLDERS if name in ("max", "min") else REDUCED,
        total=lambda t: mpi_ops.allreduce(t, "sum", comm=comm),
    )
    return differentiate(Allreduce, tensor, reduction)


def _reduce_scatter_rows(grad: torch.Tensor, rows: int, comm: Comm) -> torch.Tensor:
    """The sum over the ranks of ``grad``'s rows that came from this rank, which has ``rows`` of them."""
    # on the gradient's device, so the counts take the same path as the gradient
    counts = mpi_ops.allgather(
        torch.tensor([rows], dtype=torch.int64, device=grad.device), comm=comm
    ).tolist()
    if len(set(counts)) == 1:
        return mpi_ops.reduce_scatter(grad, "sum", comm=comm)
    if checked_call(grad, "sum", comm, "reduce_scatter") == FALLBACK:
        raise InvalidBufferError(
            f"the gradient of an allgather of rows that differ between ranks ({counts}) is reduced on the "
            "cpu only; torch.distributed reduce-scatters equal rows"
        )
    row_size = grad[0].numel()

    def job(communicator: api.Communicator) -> torch.Tensor:
        out = grad.new_empty((rows, *grad.shape[1:]))
        elements = [n * row_size for n in counts]
        with device_of(grad):
            api.reduce_scatter(_flat(grad), "sum", counts=elements, out=_flat(out), comm=communicator)
        return out

    return submit_job(comm, job).result()


def _flat(tensor: torch.Tensor) -> Any:
    """A flat zero-copy view: numpy for a cpu tensor, CuPy for a cuda one (see ``array_view``)."""
    return array_view(tensor).reshape(-1)


def allgather(tensor: torch.Tensor, *, comm: Comm = None) -> torch.Tensor:
    """Every rank's ``tensor`` concatenated along the first dimension; a new tensor autograd differentiates.

    As :func:`~collectives.torch_integration.allgather`, the first dimension may
    differ between ranks. Backward reduce-scatters the gradient with a sum:
    each rank gets the gradient of its own rows, summed over the ranks.

    Args:
        tensor: a contiguous tensor; ``requires_grad`` the same on every rank.
        comm: the communicator, as for :func:`~collectives.torch_integration.allreduce_async_`.
    """
    shape = tensor.shape
    rows = shape[0] if shape else 1  # a 0-d tensor is gathered as one row

    def gradient(grad: torch.Tensor) -> torch.Tensor:
        return _reduce_scatter_rows(grad, rows, comm).reshape(shape)

    return differentiate(Collective, tensor, lambda t: mpi_ops.allgather(t, comm=comm), gradient)


def reduce_scatter(tensor: torch.Tensor, op: str = "sum", *, comm: Comm = None) -> torch.Tensor:
    """This rank's rows of the reduction of ``tensor`` over the ranks; a new tensor autograd differentiates.

    As :func:`~collectives.torch_integration.reduce_scatter`: ``tensor`` has
    ``P * k`` rows and rank ``r`` gets rows ``r * k`` to ``(r + 1) * k``.
    Backward allgathers the gradient (divided by P for ``avg``).

    Args:
        tensor: a contiguous tensor of the same shape and dtype on every rank;
            ``requires_grad`` the same on every rank.
        op: ``sum`` or ``avg``.
        comm: the communicator, as for :func:`~collectives.torch_integration.allreduce_async_`.

    Raises:
        UnsupportedOpError: for any other op, before any data moves; a rank whose op
            is fine raises :class:`~collectives.PeerInputError` where another's is not.
    """
    name = _differentiable("reduce_scatter", op, comm, tensor)

    def gradient(grad: torch.Tensor) -> torch.Tensor:
        whole = mpi_ops.allgather(grad, comm=comm)
        if name == "avg" and grad.shape[0]:
            whole = whole / (whole.shape[0] // grad.shape[0])  # the world size
        return whole

    return differentiate(Collective, tensor, lambda t: mpi_ops.reduce_scatter(t, name, comm=comm), gradient)


def _reduce_to_root(grad: torch.Tensor, root: int, comm: Comm) -> torch.Tensor:
    """The sum of ``grad`` over the ranks at ``root``; zeros elsewhere."""
    if checked_call(grad, "sum", comm, "reduce") == FALLBACK:
        total = grad.clone()
        dist.reduce(total, dst=root)
        return total if dist.get_rank() == root else torch.zeros_like(grad)

    def job(communicator: api.Communicator) -> torch.Tensor:
        total = torch.zeros_like(grad)
        with device_of(grad):
            api.reduce(_flat(grad), "sum", root, out=_flat(total), comm=communicator)
        return total

    return submit_job(comm, job).result()


def broadcast(tensor: torch.Tensor, root_rank: int = 0, *, comm: Comm = None) -> torch.Tensor:
    """The root's ``tensor`` on every rank, in a new tensor autograd differentiates.

    Backward follows ``torch.distributed.nn.functional.broadcast``: the root's
    input gets the gradient summed over all ranks (a reduce to the root), and
    every other rank's input gets zeros, as its value was not used.

    Args:
        tensor: a contiguous tensor of the same shape and dtype on every rank;
            only the root's values are read. ``requires_grad`` the same on every rank.
        root_rank: the rank whose tensor is sent.
        comm: the communicator, as for :func:`~collectives.torch_integration.allreduce_async_`.
    """
    return differentiate(
        Collective,
        tensor,
        lambda t: mpi_ops.broadcast_(t.detach().clone(), root_rank, comm=comm),
        lambda grad: _reduce_to_root(grad, root_rank, comm),
    )
