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

    mpiexec --with-ft ulfm -n 4 python examples/train.py --survive [--replace]  # Open MPI 5

``--survive`` (modes optimizer and ps-sync) survives the death of a rank, under an MPI with fault
tolerance (Open MPI's ULFM; docs/fault_tolerance.md): rank ``r`` trains on data shard
``r``, and model, optimizer state, step and the shards each rank owns are checkpointed
in memory every ``--checkpoint-every`` steps (a copy on the next rank). When a step or
checkpoint fails because a rank died (or hung past ``--timeout``), the survivors shrink
to a communicator of their own, go back to the last checkpoint, and the holder of the
lost rank's copy takes over its shards: it computes their gradients too. Gradients are
summed over the ranks and divided by the number of shards, so every step still averages
over all shards. With ``--replace`` a new process takes the lost rank's place instead
(the world size stays, and so does the arithmetic: the final parameters equal an
unfailed run's bitwise). In ps-sync the store's shards (parameters and momentum on
each rank's server) go into the same checkpoint, and the survivors restore them on a
new store, the lost server's from its copy. Every rank prints one ``SURVIVED {json}`` line at the end (a
replacement's ``rank`` as ``-1 - rank``), with its recoveries and how long each took.
``--save-parameters FILE`` has rank 0 write the final parameters there (numpy ``.npz``).
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import collectives
from collectives import kvstore, resilience
from collectives import torch_integration as ti
from collectives.errors import BrokenCommunicatorError, CollectiveTimeout

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
    parser.add_argument("--survive", action="store_true", help="survive a rank's death (ULFM)")
    parser.add_argument("--replace", action="store_true", help="with --survive: replace a lost rank")
    parser.add_argument("--timeout", type=float, default=30.0, help="with --survive: a hung rank's limit, s")
    parser.add_argument("--save-parameters", help="rank 0 writes the final parameters to this .npz file")
    args = parser.parse_args()
    if (args.survive or args.replace) and (args.mode not in ("optimizer", "ps-sync") or args.checkpoint_dir):
        parser.error("--survive works in modes optimizer and ps-sync, without --checkpoint-dir")
    if args.replace and not args.survive:
        parser.error("--replace needs --survive")
    torch.set_num_threads(args.threads)

    model = build_model(args.width)
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE, momentum=MOMENTUM)
    if args.survive:
        _train_surviving(args, model, optimizer)
        return
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
        print(f"parameters sha256 {_digest(net)}", flush=True)
        if args.save_parameters:
            _save_parameters(args.save_parameters, net)
    if isinstance(optimizer, ti.KVStoreOptimizer):
        optimizer.kv.close()  # returns once every worker has closed: the servers serve until then
    if dist.is_initialized():
        # DDP goes first, while the group still holds its own reference: a gloo group that DDP's
        # reducer frees can hang the exit (torch joins gloo's threads while holding the GIL)
        del model, optimizer
        dist.destroy_process_group()


LEARNING_RATE, MOMENTUM = 0.05, 0.9


def build_model(width: int) -> torch.nn.Module:
    """The MLP every mode trains, its initial weights the same in every process (seeded)."""
    torch.manual_seed(0)  # the same initial model everywhere; broadcast_parameters makes sure of it
    return torch.nn.Sequential(
        torch.nn.Linear(128, width), torch.nn.ReLU(),
        torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )  # fmt: skip


def shards_loss(model: torch.nn.Module, step: int, shards: list[int], batch: int) -> torch.Tensor:
    """The sum over ``shards`` of each shard's mean loss at ``step``: its gradient is the shards' sum."""
    losses = []
    for shard in shards:
        x, y = _batch(step, shard, batch)
        losses.append(torch.nn.functional.cross_entropy(model(x), y))
    return torch.stack(losses).sum()


def _train_surviving(args: argparse.Namespace, model: torch.nn.Module, sgd: torch.optim.Optimizer) -> None:
    """``--survive``: train to ``--steps`` whatever ranks die on the way (see the module's docstring)."""
    joined = resilience.join()  # in a replacement a survivors' replace() started; None in the job's ranks
    if joined is None:
        comm = collectives.Communicator(timeout=args.timeout)
        ti.broadcast_parameters(model.state_dict(), root_rank=0, comm=comm)
        launch, checkpointer = comm.rank, resilience.Checkpointer(comm, replicas=1)
        state: dict[str, Any] = {"step": 0, "shards": [comm.rank], "of": comm.size}
    else:
        comm, checkpointer, launch = joined.communicator, joined.checkpointer, -1 - joined.communicator.rank
        state = joined.state()
        _restore(state, model, sgd)
    shards = [state.pop("kv")] if "kv" in state else None  # a replacement's: the lost rank's store shards
    optimizer = _wrap(sgd, model, args, comm, shards)
    checkpointer.checkpoint(_snapshot(state, model, sgd, optimizer))  # as the survivors do after recovering
    recoveries: list[dict[str, Any]] = []
    failed_at: float | None = None
    recovered: dict[str, Any] = {}
    while state["step"] < args.steps:
        step = state["step"]
        try:  # a step, and the checkpoint after it: a death in either goes back to the last checkpoint
            optimizer.zero_grad()
            loss = shards_loss(model, step, state["shards"], args.batch)
            loss.backward()
            if isinstance(optimizer, ti.DistributedOptimizer):
                optimizer.synchronize()  # the gradients summed over the ranks, so over all the shards
            for param in model.parameters():
                assert param.grad is not None
                param.grad.div_(state["of"])  # the average over the shards, however many ranks hold them
            optimizer.step()  # ps-sync: the store's servers sum the pushes and step
            state["step"] = step + 1
            if state["step"] % args.checkpoint_every == 0:
                checkpointer.checkpoint(_snapshot(state, model, sgd, optimizer))
        except (BrokenCommunicatorError, CollectiveTimeout) as error:
            failed_at = time.perf_counter()
            recovery = resilience.recover(checkpointer, hung=resilience.hung_ranks(error))
            if args.replace:  # a new process in each lost rank's place: the world size stays
                argv = [sys.executable, os.path.abspath(__file__), *sys.argv[1:]]
                recovery = resilience.replace(recovery, argv)
            comm, checkpointer = recovery.communicator, recovery.checkpointer
            state = recovery.state()
            for lost in recovery.adopted.values():  # the lost ranks' shards, now this rank's to compute
                state["shards"] = sorted(state["shards"] + lost["shards"])
            _restore(state, model, sgd)
            if isinstance(optimizer, ti.DistributedOptimizer):
                optimizer.remove_hooks()  # the new wrapper reduces on the survivors' communicator
            # ps-sync: a new store on the survivors, the lost servers' partitions from their replicas
            shards = None
            if "kv" in state:
                shards = [state.pop("kv")] + [lost["kv"] for lost in recovery.adopted.values()]
            optimizer = _wrap(sgd, model, args, comm, shards)
            checkpointer.checkpoint(_snapshot(state, model, sgd, optimizer))  # adopted ones on the new ring
            recovered = {
                "error": f"{type(error).__name__}: {str(error).splitlines()[0]}",
                "lost": list(recovery.lost),
                "failed_in_step": step,
                "back_to_step": state["step"],
                "recover_s": round(time.perf_counter() - failed_at, 4),
            }
            if comm.rank == 0:
                gone = ", ".join(map(str, recovery.lost))
                print(f"lost rank(s) {gone} in step {step}; back to step {state['step']}", flush=True)
            continue
        if failed_at is not None:  # the first step completed since the failure
            recovered["to_next_step_s"] = round(time.perf_counter() - failed_at, 4)
            recoveries.append(recovered)
            failed_at = None
        if comm.rank == 0:
            print(f"step {step:3d}  loss {loss.item() / len(state['shards']):.6f}", flush=True)
    seen = {
        "rank": launch,
        "size": comm.size,
        "step": state["step"],
        "shards": state["shards"],
        "sha256": _digest(model),
        "recoveries": recoveries,
    }
    print("SURVIVED " + json.dumps(seen), flush=True)
    if comm.rank == 0:
        print(f"parameters sha256 {seen['sha256']}", flush=True)
        if args.save_parameters:
            _save_parameters(args.save_parameters, model)


def _wrap(
    sgd: torch.optim.Optimizer,
    model: torch.nn.Module,
    args: argparse.Namespace,
    comm: collectives.Communicator,
    shards: list[dict[str, Any]] | None = None,
) -> ti.DistributedOptimizer | ti.KVStoreOptimizer:
    """``sgd`` wrapped to sum the gradients over ``comm``'s ranks (the caller divides by the shards).

    ps-sync: a store over ``comm`` whose servers sum and step, restored from
    ``shards`` (``KVStore.state()`` dicts) where given.
    """
    named = model.named_parameters()
    if args.mode != "ps-sync":
        return ti.DistributedOptimizer(sgd, named, compression=args.compression, op="sum", comm=comm)
    kv = kvstore.create("sync", comm=comm, timeout=args.timeout)
    if shards is not None:
        kv.restore(shards)
    return ti.KVStoreOptimizer(sgd, kv, named, average=False, loaded=shards is not None)


def _snapshot(
    state: dict[str, Any],
    model: torch.nn.Module,
    sgd: torch.optim.Optimizer,
    optimizer: ti.DistributedOptimizer | ti.KVStoreOptimizer,
) -> dict[str, Any]:
    """What a checkpoint keeps: step, shards, model and optimizer state (pickled, so copied, when taken).

    ps-sync: the store's shards on this rank's server too (their values and momentum).
    """
    kept = {**state, "model": model.state_dict(), "optimizer": sgd.state_dict()}
    if isinstance(optimizer, ti.KVStoreOptimizer):
        kept["kv"] = optimizer.kv.state()
    return kept


def _restore(state: dict[str, Any], model: torch.nn.Module, sgd: torch.optim.Optimizer) -> None:
    """Model and optimizer back to a checkpoint's, in place (the optimizer keeps its parameters)."""
    model.load_state_dict(state.pop("model"))
    sgd.load_state_dict(state.pop("optimizer"))


def _digest(model: torch.nn.Module) -> str:
    """The sha256 of the parameters' bytes, to compare runs bitwise."""
    return hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()


def _save_parameters(path: str, model: torch.nn.Module) -> None:
    np.savez(path, *(p.detach().numpy() for p in model.parameters()))


def _batch(step: int, rank: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank ``rank``'s share of step ``step``'s batch: noisy points labelled by a fixed random teacher."""
    teacher = torch.randn(128, 10, generator=torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(batch, 128, generator=generator)
    labels = (x @ teacher + 2.0 * torch.randn(batch, 10, generator=generator)).argmax(dim=1)
    return x, labels


if __name__ == "__main__":
    main()
