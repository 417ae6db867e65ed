"""A small model and data set trained the same way in one process and data-parallel, for the torch tests."""

__all__ = ["BATCH", "STEPS", "batch", "model", "relative_error", "shard", "train"]

from collections.abc import Callable

import torch

BATCH = 60
"""The global batch: divisible by every world size the tests use (1 to 5)."""
STEPS = 4


def model(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A two-layer MLP, with the same weights wherever it is built with the same seed."""
    generator = torch.Generator().manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)).to(dtype)
    with torch.no_grad():
        for param in net.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=dtype) * 0.5)
    return net


def batch(step: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: inputs and regression targets."""
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 8, generator=generator, dtype=dtype)
    return x, torch.randn(BATCH, 4, generator=generator, dtype=dtype)


def shard(tensor: torch.Tensor, rank: int, size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a global batch."""
    rows = tensor.shape[0] // size
    return tensor[rank * rows : (rank + 1) * rows]


def train(
    net: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    rank: int = 0,
    size: int = 1,
    steps: int = STEPS,
    before_step: Callable[[], None] | None = None,
) -> list[torch.Tensor]:
    """SGD on ``rank``'s shard of each step's batch (the mean loss over it); the final parameters."""
    for step in range(steps):
        first = next(net.parameters())
        x, y = (part.to(first.device) for part in batch(step, first.dtype))
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(net(shard(x, rank, size)), shard(y, rank, size)).backward()
        if before_step is not None:
            before_step()
        optimizer.step()
    return [param.detach().clone() for param in net.parameters()]


def relative_error(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> float:
    """The largest ``|a - e| / |e|`` (Frobenius norms) over the tensors."""
    return max(
        float((a.double() - e.double()).norm() / e.double().norm())
        for a, e in zip(actual, expected, strict=True)
    )
