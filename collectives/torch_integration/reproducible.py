"""Gradients summed reproducibly: a DDP hook, and micro-batch gradients with the same bits however dealt.

:class:`ReproducibleGradients` makes a model's update independent of how the
global batch's micro-batches are dealt to the ranks: each micro-batch's gradients
are one contribution of a :class:`~collectives.ReproducibleSum`, so 12
micro-batches on 1, 2, 3 or 4 ranks give bitwise equal gradients, and so equal
parameters step after step (examples/reproducible_train.py). The DDP hook and
``DistributedOptimizer(..., reproducible=True)`` make the sum over the ranks
independent of the algorithm and world size; the gradients each rank accumulates
itself (``no_sync``, ``backward_passes_per_step``) are still summed by torch.
"""

__all__ = ["ReproducibleGradients", "reproducible_allreduce_hook"]

from collections.abc import Iterable

import numpy as np
import torch
from torch._C._distributed_c10d import GradBucket  # at run time: DDP checks hook annotations against it

from .. import api
from ..errors import CollectivesError, InvalidBufferError
from ..reproducible_sum import ReproducibleSum
from .hooks import TensorFuture, hook_future
from .mpi_ops import checked_call, communicator_for
from .tensors import FALLBACK, Comm, host_view


def reproducible_allreduce_hook(state: Comm, bucket: GradBucket) -> TensorFuture:
    """A DDP communication hook averaging gradients with ``allreduce(..., reproducible=True)``.

    ``model.register_comm_hook(comm, reproducible_allreduce_hook)``, the state as for
    :func:`~collectives.torch_integration.allreduce_hook` (a communicator of this
    library: another torch.distributed backend's sum is not reproducible). The
    average's bits depend only on the ranks' gradients, not on the algorithm or the
    order of the ranks. A cuda bucket is reduced through a host copy.
    """
    buffer = bucket.buffer()
    if checked_call(buffer, "avg", state, "allreduce") == FALLBACK:
        raise CollectivesError("reproducible_allreduce_hook needs a communicator of this library, not gloo's")

    def job(communicator: api.Communicator) -> torch.Tensor:
        host = buffer if buffer.device.type == "cpu" else buffer.cpu()
        view = host_view(host)
        api.allreduce(view, "avg", out=view, comm=communicator, reproducible=True)
        return buffer if host is buffer else buffer.copy_(host)

    return hook_future(state, job)


class ReproducibleGradients:
    """Micro-batches' gradients summed over every rank with bits that do not depend on the deal.

    After each micro-batch's backward, :meth:`add` takes the parameters'
    ``.grad`` as one contribution (and zeroes them); :meth:`allreduce` writes the
    sum (or, ``average=True``, the mean) of every rank's contributions into
    ``.grad``, the same bits on every rank whatever the world size, the deal of
    micro-batches or the algorithm, so a step after it is too. Collective, as
    any allreduce; the micro-batches themselves must give the same gradients
    wherever they run (the same model, data and thread count).

    Args:
        parameters: the parameters whose gradients are summed (``model.parameters()``),
            of one floating dtype, on the cpu; the same on every rank, in the same order.
        comm: the communicator; see :mod:`collectives.api`.
    """

    def __init__(self, parameters: Iterable[torch.Tensor], *, comm: Comm = None) -> None:
        self.parameters = [p for p in parameters if p.requires_grad]
        if not self.parameters:
            raise InvalidBufferError("ReproducibleGradients needs parameters that require gradients")
        dtypes = {p.dtype for p in self.parameters}
        devices = {p.device.type for p in self.parameters}
        if len(dtypes) != 1 or devices != {"cpu"}:
            raise InvalidBufferError(
                f"ReproducibleGradients takes cpu parameters of one dtype, not {sorted(map(str, dtypes))} "
                f"on {sorted(devices)}"
            )
        self._communicator = communicator_for(comm)
        self._flat = torch.zeros(sum(p.numel() for p in self.parameters), dtype=self.parameters[0].dtype)
        self._view = host_view(self._flat)
        self._sum = ReproducibleSum(like=self._view)

    @property
    def count(self) -> int:
        """The micro-batches added on this rank since the last :meth:`allreduce`."""
        return self._sum.count

    @torch.no_grad()
    def add(self, *, zero: bool = True) -> None:
        """Add the parameters' gradients as one contribution (a missing ``.grad`` counts as zeros)."""
        offset = 0
        for param in self.parameters:
            piece = self._flat[offset : offset + param.numel()]
            if param.grad is None:
                piece.zero_()
            else:
                piece.copy_(param.grad.reshape(-1))
                if zero:
                    param.grad.zero_()
            offset += param.numel()
        self._sum.add(self._view)

    @torch.no_grad()
    def allreduce(self, *, average: bool = False, algorithm: str = "auto") -> None:
        """Put the sum of every rank's contributions into ``.grad``, and start anew; collective.

        Args:
            average: divide the sum by the number of contributions of all ranks together.
            algorithm: the algorithm of the sum's allreduce; see :func:`collectives.allreduce`.
        """
        communicator = self._communicator
        total = self._sum.allreduce(algorithm=algorithm, comm=communicator)
        if average:
            counts = api.allreduce(np.array([self._sum.count], np.int64), comm=communicator)
            total = total / total.dtype.type(max(int(counts[0]), 1))
        self._sum.reset()
        np.copyto(self._view, total)
        offset = 0
        for param in self.parameters:
            piece = self._flat[offset : offset + param.numel()].view_as(param)
            if param.grad is None:
                param.grad = piece.clone()
            else:
                param.grad.copy_(piece)
            offset += param.numel()
