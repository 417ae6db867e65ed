"""The calls of Horovod's pytorch_mnist_elastic.py, in order, on small random images: run under mpiexec.

As the example: samplers sharding the data by ``hvd.size()`` and ``hvd.rank()``,
SGD with momentum wrapped by ``hvd.DistributedOptimizer``, ``@hvd.elastic.run``
over a ``TorchState(model, optimizer, epoch=1, batch=0)`` whose loops run on
the state's own attributes and commit every batch, a reset callback, then a
test whose metrics are averaged with named ``hvd.allreduce`` calls. Every rank
that ends prints ``MNIST {json}``: its ranks, the resets, the test metrics and
a digest of its parameters.

Usage: ``python -m tests.horovod_scripts.elastic_mnist EPOCHS``.
"""

import hashlib
import json
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import collectives.horovod as hvd

LR = 0.01


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(1, 4, kernel_size=3)
        self.fc = torch.nn.Linear(4 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv(x), 1))
        return F.log_softmax(self.fc(x.flatten(1)), dim=1)


def main(epochs: int) -> None:
    hvd.init()
    launch_rank = hvd.rank()
    torch.manual_seed(42)
    images = torch.randn(96, 1, 8, 8)
    labels = torch.randint(0, 10, (96,))
    train_dataset, test_dataset = (
        TensorDataset(images[:64], labels[:64]),
        TensorDataset(images[64:], labels[64:]),
    )
    train_sampler = DistributedSampler(train_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    train_loader = DataLoader(train_dataset, batch_size=4, sampler=train_sampler)
    test_sampler = DistributedSampler(test_dataset, num_replicas=hvd.size(), rank=hvd.rank())
    test_loader = DataLoader(test_dataset, batch_size=8, sampler=test_sampler)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR * hvd.size(), momentum=0.5)
    resets: list[int] = []

    def metric_average(value: float, name: str) -> float:
        return float(hvd.allreduce(torch.tensor(value), name=name).item())

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        for state.epoch in range(state.epoch, epochs + 1):  # noqa: B020 (the example's own loop)
            state.model.train()
            train_sampler.set_epoch(state.epoch)
            steps_remaining = len(train_loader) - state.batch
            for state.batch, (data, target) in enumerate(train_loader):
                if state.batch >= steps_remaining:
                    break
                state.optimizer.zero_grad()
                loss = F.nll_loss(state.model(data), target)
                loss.backward()
                state.optimizer.step()
                state.commit()
            state.batch = 0

    def test() -> tuple[float, float]:
        model.eval()
        test_loss, test_accuracy = 0.0, 0.0
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            test_accuracy += float(output.argmax(1).eq(target).sum())
        test_loss /= len(test_sampler)
        test_accuracy /= len(test_sampler)
        return metric_average(test_loss, "avg_loss"), metric_average(test_accuracy, "avg_accuracy")

    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())

    def on_state_reset() -> None:
        resets.append(hvd.size())
        for group in optimizer.param_groups:
            group["lr"] = LR * hvd.size()

    state = hvd.elastic.TorchState(model, optimizer, epoch=1, batch=0)
    state.register_reset_callbacks([on_state_reset])
    train(state)
    loss, accuracy = test()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()
    record = {"launch_rank": launch_rank, "rank": hvd.rank(), "size": hvd.size(), "epoch": state.epoch}
    metrics = {"loss": loss, "accuracy": accuracy}
    print("MNIST " + json.dumps({**record, "resets": resets, **metrics, "digest": digest}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
