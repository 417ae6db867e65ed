"""The autograd functions of the differentiable collectives, each backward a policy its caller chooses."""

__all__ = ["HOLDERS", "REDUCED", "Allreduce", "Collective", "Reduction", "differentiate"]

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

Reduce = Callable[[torch.Tensor], torch.Tensor]

REDUCED = "reduced"
"""Backward reduces the gradient as forward reduced the input: the same op and scaling (Horovod's)."""
HOLDERS = "holders"
"""Backward gives the gradient summed over the ranks to the ranks holding max's or min's value,
shared evenly between ties, as :func:`torch.amax` does (torch.distributed.nn's convention)."""


@dataclass(frozen=True)
class Reduction:
    """One allreduce as autograd sees it: how it reduces, and how its gradient is reduced.

    Attributes:
        reduce: the forward's reduction of a tensor, in a new tensor.
        policy: :data:`REDUCED` or :data:`HOLDERS`.
        reduce_gradient: the gradient's reduction under :data:`REDUCED`; ``reduce`` where ``None``.
        total: under :data:`HOLDERS`, the sum of a tensor over the same ranks.
    """

    reduce: Reduce
    policy: str = REDUCED
    reduce_gradient: Reduce | None = None
    total: Reduce | None = None


class Allreduce(torch.autograd.Function):
    """The one differentiable allreduce: forward is ``reduction.reduce``, backward its ``policy``."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, reduction: Reduction) -> Any:
        result = reduction.reduce(tensor)
        ctx.reduction = reduction
        if reduction.policy == HOLDERS:
            ctx.save_for_backward(tensor, result)
        return result

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        reduction: Reduction = ctx.reduction
        if reduction.policy == REDUCED:
            return (reduction.reduce_gradient or reduction.reduce)(grad.contiguous()), None
        assert reduction.total is not None  # HOLDERS is made with its sum (a library bug otherwise)
        tensor, result = ctx.saved_tensors
        holds = (tensor == result).to(grad.dtype)
        holders = reduction.total(holds)
        total = reduction.total(grad.contiguous())
        return total * holds / holders, None


class Collective(torch.autograd.Function):
    """Another differentiable collective: forward ``run(tensor)``, backward ``gradient(grad)``, its policy."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, run: Reduce, gradient: Reduce) -> Any:
        ctx.gradient = gradient
        return run(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return ctx.gradient(grad.contiguous()), None, None


def differentiate(function: type[torch.autograd.Function], *args: Any) -> torch.Tensor:
    """``function.apply(*args)``, typed: the tensor autograd differentiates."""
    result: torch.Tensor = function.apply(*args)  # type: ignore[no-untyped-call]  # torch leaves it untyped
    return result
