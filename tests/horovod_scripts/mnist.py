"""The calls of Horovod's pytorch_mnist.py, in order, on random 28x28 images: run under mpiexec.

Exits non-zero unless the averaged metrics are the mean of every rank's, and
every rank ends with the same parameters.
"""

import argparse
import sys

import torch
import torch.nn.functional as F
import torch.utils.data.distributed
from torch import nn

import collectives.horovod as hvd

parser = argparse.ArgumentParser(description="MNIST-shaped training through collectives.horovod")
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--test-batch-size", type=int, default=100)
parser.add_argument("--epochs", type=int, default=2)  # metrics reuse their names
parser.add_argument("--lr", type=float, default=0.01)
parser.add_argument("--momentum", type=float, default=0.5)
parser.add_argument("--seed", type=int, default=42)
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--gradient-predivide-factor", type=float, default=1.0)
parser.add_argument("--synchronize-first", action="store_true", help="the mixed-precision loop's calls")
args = parser.parse_args()


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=5)
        self.fc1 = nn.Linear(4 * 12 * 12, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        return F.log_softmax(self.fc1(x.flatten(1)), dim=1)


def synthetic(size: int, seed: int) -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(size, 1, 28, 28, generator=generator)
    return torch.utils.data.TensorDataset(images, torch.randint(0, 10, (size,), generator=generator))


hvd.init()
torch.manual_seed(args.seed)
torch.set_num_threads(1)
train_dataset = synthetic(512, 0)
train_sampler = torch.utils.data.distributed.DistributedSampler(
    train_dataset, num_replicas=hvd.size(), rank=hvd.rank()
)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, sampler=train_sampler)
test_dataset = synthetic(200, 1)
test_sampler = torch.utils.data.distributed.DistributedSampler(
    test_dataset, num_replicas=hvd.size(), rank=hvd.rank()
)
test_loader = torch.utils.data.DataLoader(test_dataset, batch_size=args.test_batch_size, sampler=test_sampler)

model = Net()
lr_scaler = hvd.size() if not args.use_adasum else 1
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * lr_scaler, momentum=args.momentum)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
    gradient_predivide_factor=args.gradient_predivide_factor,
)


def train_epoch(epoch: int) -> None:
    model.train()
    train_sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        if args.synchronize_first:
            optimizer.synchronize()  # as the mixed-precision loop: reduce, then step without reducing again
            with optimizer.skip_synchronize():
                optimizer.step()
        else:
            optimizer.step()
        if batch_idx % 4 == 0 and hvd.rank() == 0:
            seen = f"[{batch_idx * len(data)}/{len(train_sampler)}]"
            print(f"Train Epoch: {epoch} {seen}\tLoss: {loss.item():.6f}")


def metric_average(val: float, name: str) -> float:
    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return float(avg_tensor.item())


def test() -> bool:
    model.eval()
    test_loss, test_accuracy = 0.0, 0.0
    with torch.no_grad():
        for data, target in test_loader:
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()
            test_accuracy += float(output.argmax(1).eq(target).float().sum())
    test_loss /= len(test_sampler)
    test_accuracy /= len(test_sampler)
    every = hvd.allgather_object((test_loss, test_accuracy))
    averaged = metric_average(test_loss, "avg_loss"), metric_average(test_accuracy, "avg_accuracy")
    expected = [sum(values) / hvd.size() for values in zip(*every, strict=True)]
    right = all(abs(a - e) <= 1e-5 * max(1.0, abs(e)) for a, e in zip(averaged, expected, strict=True))
    if hvd.rank() == 0:
        print(f"\nTest set: Average loss: {averaged[0]:.4f}, Accuracy: {100.0 * averaged[1]:.2f}%\n")
    return right


ok = True
for epoch in range(1, args.epochs + 1):
    train_epoch(epoch)
    ok = test() and ok
flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = all(torch.equal(flat, other) for other in hvd.allgather_object(flat))
if hvd.rank() == 0:
    print(
        "metrics averaged" if ok else "METRICS NOT AVERAGED",
        "/",
        "parameters equal" if same else "PARAMS DIFFER",
    )
hvd.shutdown()
sys.exit(0 if ok and same else 1)
