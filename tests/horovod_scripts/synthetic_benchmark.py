"""The calls of Horovod's pytorch_synthetic_benchmark.py, in order, on a small CNN: run under mpiexec.

Exits non-zero unless every rank ends with the same parameters.
"""

import argparse
import sys
import timeit

import numpy as np
import torch
import torch.nn.functional as F

import collectives.horovod as hvd

parser = argparse.ArgumentParser(description="synthetic benchmark through collectives.horovod")
parser.add_argument("--fp16-allreduce", action="store_true")
parser.add_argument("--use-adasum", action="store_true")
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--num-warmup-batches", type=int, default=2)
parser.add_argument("--num-batches-per-iter", type=int, default=2)
parser.add_argument("--num-iters", type=int, default=3)
args = parser.parse_args()

hvd.init()
use_cuda = False  # the CPU path; on a GPU the example pins hvd.local_rank()'s device here
torch.manual_seed(hvd.rank())  # unlike weights on every rank, until the broadcast below
model = torch.nn.Sequential(
    torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(4), torch.nn.Flatten(),
    torch.nn.Linear(128, 10),
)  # fmt: skip
lr_scaler = hvd.size() if not args.use_adasum else 1
if use_cuda and args.use_adasum and hvd.nccl_built():
    lr_scaler = hvd.local_size()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * lr_scaler)
compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none
optimizer = hvd.DistributedOptimizer(
    optimizer,
    named_parameters=model.named_parameters(),
    compression=compression,
    op=hvd.Adasum if args.use_adasum else hvd.Average,
)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)

data = torch.randn(args.batch_size, 3, 16, 16)
target = torch.LongTensor(args.batch_size).random_() % 10


def benchmark_step() -> None:
    optimizer.zero_grad()
    loss = F.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()


def log(text: str) -> None:
    if hvd.rank() == 0:
        print(text, flush=True)


log(f"Number of CPUs: {hvd.size()} (local rank {hvd.local_rank()} of {hvd.local_size()})")
timeit.timeit(benchmark_step, number=args.num_warmup_batches)
img_secs = []
for x in range(args.num_iters):
    time = timeit.timeit(benchmark_step, number=args.num_batches_per_iter)
    img_secs.append(args.batch_size * args.num_batches_per_iter / time)
    log(f"Iter #{x}: {img_secs[-1]:.1f} img/sec per CPU")
log(f"Img/sec per CPU: {np.mean(img_secs):.1f} +-{1.96 * np.std(img_secs):.1f}")
log(f"Total img/sec on {hvd.size()} CPU(s): {hvd.size() * np.mean(img_secs):.1f}")

flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
same = all(torch.equal(flat, other) for other in hvd.allgather_object(flat))
log("parameters equal on every rank" if same else "PARAMETERS DIFFER BETWEEN RANKS")
hvd.shutdown()
sys.exit(0 if same else 1)
