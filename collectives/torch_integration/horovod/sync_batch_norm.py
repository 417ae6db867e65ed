"""SyncBatchNorm: batch normalisation whose batch statistics are taken over every rank's batch."""

__all__ = ["SyncBatchNorm"]

import itertools
from typing import Any

import torch
from torch.autograd.function import FunctionCtx
from torch.nn.modules.batchnorm import _BatchNorm

from ... import api
from ..collective_jobs import allreduce_scaled_
from ..mpi_ops import communicator_for
from ..named import named_ops

_calls = itertools.count()  # the same sequence on every rank: each forward and backward is named by it


def _sum_over_ranks(tensor: torch.Tensor) -> torch.Tensor:
    out = tensor.detach().clone().contiguous()
    communicator = communicator_for(None)

    def job(comm: api.Communicator) -> torch.Tensor:
        allreduce_scaled_([out], "sum", 1.0, 1.0, comm)
        return out

    future = named_ops(communicator).submit(f"sync_batch_norm.{next(_calls)}", job)
    return future.result()


class _SumOverRanks(torch.autograd.Function):
    """The sum over the ranks; its gradient is the sum over the ranks of the gradients (of every loss)."""

    @staticmethod
    def forward(ctx: FunctionCtx, tensor: torch.Tensor) -> torch.Tensor:
        return _sum_over_ranks(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return _sum_over_ranks(grad)


class SyncBatchNorm(_BatchNorm):
    """Batch normalisation over the whole batch of every rank, in training; as ``BatchNorm*d`` in evaluation.

    The mean and variance of each channel are taken over the inputs of all
    ranks (one allreduce of the per-channel count, sum and sum of squares), and
    their gradients flow back to every rank's inputs. The running statistics are
    updated with the global mean and the unbiased global variance, so they are
    the same on every rank. Every rank must run forward and backward alike.
    Takes inputs of 2 or more dimensions, channels second.
    """

    def _check_input_dim(self, input: torch.Tensor) -> None:
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(input)
        if not self.training or communicator_for(None).size == 1:
            return super().forward(input)
        channels = input.shape[1]
        flat = input.transpose(0, 1).reshape(channels, -1)
        count = torch.full((1,), float(flat.shape[1]), dtype=flat.dtype, device=flat.device)
        local = torch.cat([count, flat.sum(1), (flat * flat).sum(1)])
        total: torch.Tensor = _SumOverRanks.apply(local)  # type: ignore[no-untyped-call]
        n = total[0]
        mean = total[1 : 1 + channels] / n
        var = total[1 + channels :] / n - mean * mean
        tracked, running_mean, running_var = self.num_batches_tracked, self.running_mean, self.running_var
        if tracked is not None and running_mean is not None and running_var is not None:
            with torch.no_grad():
                tracked.add_(1)
                momentum = 1.0 / float(tracked) if self.momentum is None else float(self.momentum)
                unbiased = var.detach() * (n.detach() / (n.detach() - 1).clamp(min=1))
                running_mean.mul_(1 - momentum).add_(momentum * mean.detach())
                running_var.mul_(1 - momentum).add_(momentum * unbiased)
        shape = [1, channels] + [1] * (input.dim() - 2)
        out = (input - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + self.eps)
        if self.affine:
            out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
        result: torch.Tensor = out
        return result
