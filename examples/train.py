"""Data-parallel training of a small MLP on synthetic data, seven ways; run under mpiexec.

    mpiexec -n 4 python examples/train.py --mode optimizer  # torch_integration.DistributedOptimizer
    mpiexec -n 4 python examples/train.py --mode hook       # DDP (gloo) with collectives' allreduce hook
    mpiexec -n 4 python examples/train.py --mode backend    # DDP on the "collectives" backend
    mpiexec -n 4 python examples/train.py --mode gloo       # DDP on gloo, for comparison
    mpiexec -n 4 python examples/train.py --mode ps-sync    # the key-value store (BSP), KVStoreOptimizer
    mpiexec -n 4 python examples/train.py --mode ps-async   # ... asynchronous (ASP)
    mpiexec -n 4 python examples/train.py --mode ps-ssp --staleness 2 --straggler-ms 50  # ... SSP

    mpiexec -n 4 python examples/train.py --checkpoint-dir ckpt --checkpoint-every 10  # resumable

Every rank trains on its own share of each step's batch; rank 0 prints its loss every step
and, at the end, the median time of a step (forward, backward, gradient averaging, update).
In the ps modes each parameter is a key of a store whose servers (one per rank) run the SGD.
``--straggler-ms`` makes the last rank sleep that long in every step; ``--target-loss`` has
rank 0 say when the mean of its last 5 losses first reached it, and after how long.
With ``--checkpoint-dir`` every rank saves model, optimizer and step there every
``--checkpoint-every`` steps (in the ps modes the store's servers save their shards with it),
and a run started again with the same command resumes from the newest complete checkpoint;
at the end rank 0 prints a digest of the final parameters, to compare runs bitwise.
"""

import argparse
import hashlib
import statistics
import time

import torch
import torch.distributed as dist

from collectives import kvstore
from collectives import torch_integration as ti

MODES = ("optimizer", "hook", "backend", "gloo", "ps-sync", "ps-async", "ps-ssp")
SMOOTHING = 5  # the last losses averaged for --target-loss (fewer in the first steps)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=MODES, default="optimizer", help="how gradients are averaged")
    parser.add_argument("--steps", type=int, default=30, help="training steps")
    parser.add_argument("--warmup", type=int, default=5, help="first steps left out of the timing")
    parser.add_argument("--batch", type=int, default=64, help="samples per rank and step")
    parser.add_argument("--width", type=int, default=512, help="hidden layer width")
    parser.add_argument(
        "--compression", choices=("fp16", "bf16"), help="gradients on the wire (optimizer, hook)"
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--staleness", type=int, default=2, help="ps-ssp's bound, in steps")
    parser.add_argument("--straggler-ms", type=float, default=0.0, help="the last rank sleeps this per step")
    parser.add_argument("--target-loss", type=float, help="report when rank 0's smoothed loss reaches it")
    parser.add_argument("--checkpoint-dir", help="save there, and resume from the newest complete checkpoint")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    torch.manual_seed(0)  # the same initial model everywhere; broadcast below makes sure of it
    model = torch.nn.Sequential(
        torch.nn.Linear(128, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, args.width), torch.nn.ReLU(),
        torch.nn.Linear(args.width, 10),
    )  # fmt: skip
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    net, kv, start = model, None, 0  # the plain module (DDP wraps it), the store, the first step

    # ---- the change from one-process training, per mode
    if args.mode == "optimizer":
        ti.broadcast_parameters(model.state_dict(), root_rank=0)
        optimizer = ti.DistributedOptimizer(optimizer, model.named_parameters(), compression=args.compression)
        rank, size = ti.rank(), ti.size()
    elif args.mode.startswith("ps-"):
        mode = args.mode.removeprefix("ps-")
        kv = kvstore.create(mode, staleness=args.staleness if mode == "ssp" else 0)
        if args.checkpoint_dir:  # a store loads before its keys exist: before the optimizer makes them
            start = ti.load_training(args.checkpoint_dir, model, kv=kv) or 0
        optimizer = ti.KVStoreOptimizer(optimizer, kv, model.named_parameters(), loaded=start > 0)
        rank, size = kv.rank, kv.num_workers
    else:
        # "mpi://" takes the rank and world size from MPI; the backend named is the one DDP uses
        dist.init_process_group("collectives" if args.mode == "backend" else "gloo", init_method="mpi://")
        model = torch.nn.parallel.DistributedDataParallel(model)
        if args.mode == "hook":
            hooks = {None: ti.allreduce_hook, "fp16": ti.allreduce_fp16_hook, "bf16": ti.allreduce_bf16_hook}
            model.register_comm_hook(None, hooks[args.compression])
        rank, size = dist.get_rank(), dist.get_world_size()
    if args.checkpoint_dir and kv is None:
        start = ti.load_training(args.checkpoint_dir, net, optimizer) or 0
    if start and rank == 0:
        print(f"resumed from the checkpoint of step {start} in {args.checkpoint_dir}", flush=True)
    # ----

    times: list[float] = []
    losses: list[float] = []
    began = time.perf_counter()
    for step in range(start, args.steps):
        x, y = _batch(step, rank, args.batch)
        began_step = time.perf_counter()
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        if args.straggler_ms and rank == size - 1:
            time.sleep(args.straggler_ms / 1e3)
        optimizer.step()
        times.append(time.perf_counter() - began_step)
        if args.checkpoint_dir and (step + 1) % args.checkpoint_every == 0:
            local = None if kv is not None else optimizer  # a store's optimizer state is on its servers
            ti.save_training(args.checkpoint_dir, step + 1, net, local, kv=kv)
        if rank == 0:
            print(f"step {step:3d}  loss {loss.item():.6f}  {1e3 * times[-1]:7.2f} ms", flush=True)
            losses.append(loss.item())
            smoothed = statistics.fmean(losses[-SMOOTHING:])
            if args.target_loss is not None and smoothed <= args.target_loss:
                print(
                    f"target loss {args.target_loss} reached at step {step} "
                    f"after {time.perf_counter() - began:.3f} s",
                    flush=True,
                )
                args.target_loss = None
    if rank == 0:
        timed = times[args.warmup :] or times or [0.0]
        print(
            f"mode {args.mode}{'+' + args.compression if args.compression else ''}: {size} ranks, "
            f"median step {1e3 * statistics.median(timed):.2f} ms over {len(timed)} steps",
            flush=True,
        )
        digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in net.parameters()))
        print(f"parameters sha256 {digest.hexdigest()}", flush=True)
    if isinstance(optimizer, ti.KVStoreOptimizer):
        optimizer.kv.close()  # returns once every worker has closed: the servers serve until then
    if dist.is_initialized():
        # DDP goes first, while the group still holds its own reference: a gloo group that DDP's
        # reducer frees can hang the exit (torch joins gloo's threads while holding the GIL)
        del model, optimizer
        dist.destroy_process_group()


def _batch(step: int, rank: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of step ``step``'s batch: noisy points labelled by a fixed random teacher."""
    teacher = torch.randn(128, 10, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch, 128, generator=generator)
    labels = (x @ teacher + 2.0 * torch.randn(batch, 10, generator=generator)).argmax(dim=1)
    return x, labels


if __name__ == "__main__":
    main()
