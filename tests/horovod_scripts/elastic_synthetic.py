"""The calls of Horovod's pytorch_synthetic_benchmark_elastic.py, in order, on a small model, under mpiexec.

As the example: a model and ``hvd.DistributedOptimizer`` made once, a training
function under ``@hvd.elastic.run`` taking a ``hvd.elastic.TorchState`` (with
plain values beside the model and optimizer) that commits every batch, and a
reset callback that scales the learning rate to the new world. Unlike it, each
process's data is fixed by its rank at launch (so a test can replay the run),
and the state keeps the world size of every committed batch. Every survivor
prints ``ELASTIC {json}``: its launch rank, the world sizes of the committed
batches, the resets it saw and its final parameters.

Usage: ``python -m tests.horovod_scripts.elastic_synthetic BATCHES``.
"""

import json
import sys

import torch
import torch.nn.functional as F

import collectives.horovod as hvd

BATCH = 4
LR = 0.05


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def data_of(launch_rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(1000 + launch_rank)
    return torch.randn(BATCH, 6, generator=generator), torch.randint(0, 3, (BATCH,), generator=generator)


def main(batches: int) -> None:
    hvd.init()
    launch_rank = hvd.rank()
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size())
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    data, target = data_of(launch_rank)
    resets: list[int] = []

    def benchmark_step(state: hvd.elastic.TorchState) -> None:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(data), target)
        loss.backward()
        optimizer.step()
        state.sizes.append(hvd.size())
        state.batch += 1
        state.commit()

    @hvd.elastic.run
    def run_benchmark(state: hvd.elastic.TorchState) -> None:
        while state.batch < batches:
            benchmark_step(state)

    def on_state_reset() -> None:
        resets.append(hvd.size())
        for group in optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, batch=0, sizes=[])
    state.register_reset_callbacks([on_state_reset])
    run_benchmark(state)
    params = [p.detach().reshape(-1).tolist() for p in model.parameters()]
    record = {"launch_rank": launch_rank, "rank": hvd.rank(), "size": hvd.size(), "sizes": state.sizes}
    print("ELASTIC " + json.dumps({**record, "resets": resets, "params": params}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
