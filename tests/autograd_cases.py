"""Losses built from the differentiable collectives, and the same losses computed in one process."""

__all__ = ["CASES", "EXACT", "distributed_gradient", "input_of", "reference_gradients"]

from typing import Any

import torch

from collectives.torch_integration import functional

CASES = [
    "allreduce-sum",
    "allreduce-avg",
    "allreduce-max",
    "allreduce-min",
    "allgather",
    "allgather-0d",
    "reduce_scatter-sum",
    "reduce_scatter-avg",
    "broadcast",
]
EXACT = {"allreduce-sum", "allgather", "allgather-0d", "reduce_scatter-sum", "broadcast"}
"""Cases whose gradients are integers, so every order of summing gives the same bits; the others divide."""

ROWS, COLUMNS = 2, 3


def input_of(case: str, rank: int, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rank ``rank``'s input: small integers, with ties between ranks for max and min."""
    if case == "allgather-0d":
        return torch.tensor(float(rank + 2), dtype=dtype)
    rows = rank + 1 if case == "allgather" else ROWS * size if case.startswith("reduce_scatter") else ROWS
    values = torch.arange(rows * COLUMNS, dtype=dtype).reshape(rows, COLUMNS)
    return (values * 5 + rank * 3) % 7 - 3  # of -3..3 on every rank: many elements tie


def _weight(rank: int, like: torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s weights in its loss, so every rank's loss differs."""
    return (torch.arange(like.numel(), dtype=like.dtype).reshape(like.shape) + rank) % 4 + 1


def _loss(rank: int, output: torch.Tensor) -> torch.Tensor:
    return (output * output * _weight(rank, output)).sum()


def distributed_gradient(case: str, x: torch.Tensor, rank: int, size: int, comm: Any = None) -> torch.Tensor:
    """The gradient of this rank's input when every rank backpropagates its loss through the collective."""
    x = x.detach().clone().requires_grad_()
    collective, _, op = case.partition("-")
    if collective == "allreduce":
        y = functional.allreduce(x, op, comm=comm)
    elif collective == "allgather":
        y = functional.allgather(x, comm=comm)
    elif collective == "reduce_scatter":
        y = functional.reduce_scatter(x, op, comm=comm)
    else:
        y = functional.broadcast(x, size - 1, comm=comm)
    _loss(rank, y).backward()
    assert x.grad is not None
    return x.grad


def reference_gradients(case: str, size: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """Every rank's gradient from one process holding all the inputs: the sum of every rank's loss."""
    xs = [input_of(case, r, size, dtype).requires_grad_() for r in range(size)]
    collective, _, op = case.partition("-")
    if collective == "allreduce":
        stacked = torch.stack(xs)
        whole = {
            "sum": stacked.sum(0),
            "avg": stacked.mean(0),
            "max": stacked.amax(0),
            "min": stacked.amin(0),
        }
        outputs = [whole[op]] * size
    elif collective == "allgather":
        outputs = [torch.cat([x.reshape(-1, *x.shape[1:]) for x in xs])] * size
    elif collective == "reduce_scatter":
        stacked = torch.stack(xs)
        total = stacked.sum(0) if op == "sum" else stacked.mean(0)
        outputs = list(total.chunk(size))
    else:
        outputs = [xs[size - 1]] * size
    torch.stack([_loss(r, y) for r, y in enumerate(outputs)]).sum().backward()
    return [torch.zeros_like(x) if x.grad is None else x.grad for x in xs]
