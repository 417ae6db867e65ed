"""One training on 1 to 4 ranks, bit for bit: ``mpiexec -n P python examples/reproducible_train.py``.

Every step trains a small MLP on one global batch of 12 micro-batches, dealt to the
ranks round robin (rank r takes micro-batches r, r + P, ...). Each micro-batch's
gradients are one contribution of ``ReproducibleGradients``, whose allreduce gives the
mean over the 12 with bits that depend only on the micro-batches, not on P or the deal;
every rank then takes the same SGD step. After ``--steps`` steps (50) rank 0 prints a
SHA-256 of the parameters: the same at every world size.

With ``--plain`` each rank sums its micro-batches' gradients in ``.grad`` (torch's
accumulation) and the ranks average them with an ordinary allreduce: the float
additions then happen in another order at each world size, and the digest changes.
"""

import argparse
import hashlib
import sys

import torch

import collectives
from collectives.torch_integration import ReproducibleGradients

MICRO_BATCHES = 12
BATCH = 16  # samples a micro-batch
FEATURES = 24


def _model() -> torch.nn.Module:
    model = torch.nn.Sequential(
        torch.nn.Linear(FEATURES, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 64),
        torch.nn.Tanh(),
        torch.nn.Linear(64, 1),
    )
    # the same start on every rank from a generator of its own: ranks that are threads of one process
    # (the tests' loopback ranks) would race for torch's global one
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            bound = 1.0 / param.shape[-1] ** 0.5
            param.uniform_(-bound, bound, generator=generator)
    return model


def _micro_batch(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``index``-th micro-batch of step ``step``'s global batch: the same on every rank that asks."""
    generator = torch.Generator().manual_seed(step * MICRO_BATCHES + index)
    inputs = torch.randn(BATCH, FEATURES, generator=generator)
    targets = (
        torch.sin(inputs.sum(dim=1, keepdim=True)) * 3.0 + torch.randn(BATCH, 1, generator=generator) * 0.1
    )
    return inputs, targets


def digest(model: torch.nn.Module) -> str:
    """SHA-256 of the parameters' bytes, in order."""
    hashed = hashlib.sha256()
    for param in model.parameters():
        hashed.update(param.detach().numpy().tobytes())
    return hashed.hexdigest()


def train(
    group: collectives.Communicator, *, steps: int = 50, reproducible: bool = True, lr: float = 0.05
) -> str:
    """Train on ``group``'s ranks; the parameters' digest (the same on every rank)."""
    torch.set_num_threads(1)  # a micro-batch's gradients must not depend on the threads at hand
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    gradients = ReproducibleGradients(model.parameters(), comm=group)
    for step in range(steps):
        optimizer.zero_grad()
        for index in range(group.rank, MICRO_BATCHES, group.size):
            inputs, targets = _micro_batch(step, index)
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            loss.backward()  # plain: into .grad, summed by torch
            if reproducible:
                gradients.add()
        if reproducible:
            gradients.allreduce(average=True)
        else:
            for param in model.parameters():
                view = param.grad.numpy()  # type: ignore[union-attr]
                collectives.allreduce(view, out=view, comm=group)
                param.grad.div_(MICRO_BATCHES)  # type: ignore[union-attr]
        optimizer.step()
    return digest(model)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--plain", action="store_true", help="torch's accumulation and a plain allreduce")
    options = parser.parse_args(argv)
    comm = collectives.Communicator()
    result = train(comm, steps=options.steps, reproducible=not options.plain)
    if comm.rank == 0:
        mode = "plain" if options.plain else "reproducible"
        print(f"{mode}, {comm.size} ranks, {options.steps} steps: parameters sha256 {result}", flush=True)
    comm.free()


if __name__ == "__main__":
    main(sys.argv[1:])
