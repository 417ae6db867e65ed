"""GPU arrays' allreduce, ours against MPI through host copies: ``bench device_allreduce``.

Per size, interleaved round by round, in-place float32 sums of a CuPy array on
each rank (ranks share the GPUs, round robin):

* ``ours``: ``collectives.allreduce(x, out=x)``, over whichever device path the
  environment picks (CUDA IPC where ranks share a node, else pinned host
  staging; ``COLLECTIVES_CUDA_IPC=0`` forces staging), the path named in the
  header;
* ``ring``: the same with ``algorithm="ring"``, which always takes the device
  path (``"auto"`` runs a small allreduce on a host copy instead);
* ``mpi``: what a user of an MPI without CUDA support writes: ``x.get()``,
  ``Allreduce`` of the host copy in place, ``x.set(...)``.

The time of a call is the slowest rank's median over the rounds, the device
synchronised after each call; bus bandwidth as nccl-tests counts it,
``2 (p - 1) / p * bytes / time``. ``--array numpy`` runs the same loops on
host arrays (no GPU needed: a dry run of this script).
"""

__all__ = ["main"]

import argparse
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives

from .config import parse_size
from .small_path import interleaved_medians


def _array_module(name: str, rank: int) -> tuple[Any, Callable[[], None]]:
    """The array module and its synchronisation; CuPy on this rank's GPU."""
    if name == "numpy":
        return np, lambda: None
    import cupy

    device = cupy.cuda.Device(rank % cupy.cuda.runtime.getDeviceCount())
    device.use()
    return cupy, device.synchronize


def _contenders(
    xp: Any, synchronize: Callable[[], None], comm: collectives.Communicator, world: MPI.Intracomm, x: Any
) -> dict[str, Callable[[], None]]:
    def ours() -> None:
        collectives.allreduce(x, out=x, comm=comm)
        synchronize()

    def ring() -> None:
        collectives.allreduce(x, out=x, algorithm="ring", comm=comm)
        synchronize()

    def mpi() -> None:
        if xp is np:
            world.Allreduce(MPI.IN_PLACE, x)
            return
        host = x.get()
        world.Allreduce(MPI.IN_PLACE, host)
        x.set(host)
        synchronize()

    return {"ours": ours, "ring": ring, "mpi": mpi}


def _check(xp: Any, comm: collectives.Communicator, world: MPI.Intracomm, count: int) -> None:
    """One sum of distinct values per rank, checked against the exact answer before timing."""
    x = xp.arange(count, dtype=xp.float32) % 1024 + world.rank
    collectives.allreduce(x, out=x, comm=comm)
    expected = (np.arange(count, dtype=np.float32) % 1024) * world.size + sum(range(world.size))
    got = x.get() if xp is not np else x
    if not np.array_equal(got, expected):
        raise SystemExit(f"rank {world.rank}: wrong sum of {count} float32")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench device_allreduce", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-b", "--minbytes", type=parse_size, default=parse_size("4K"))
    parser.add_argument("-e", "--maxbytes", type=parse_size, default=parse_size("256M"))
    parser.add_argument("-f", "--stepfactor", type=int, default=4)
    parser.add_argument("-n", "--calls", type=int, default=20, help="calls per round (default 20)")
    parser.add_argument("-r", "--rounds", type=int, default=5, help="rounds (default 5)")
    parser.add_argument("--array", choices=("cupy", "numpy"), default="cupy")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    try:
        xp, synchronize = _array_module(args.array, world.rank)
    except ImportError:
        parser.error("--array cupy needs CuPy on a machine with a CUDA GPU (pip install the cupy extra); "
                     "--array numpy times host arrays instead")  # fmt: skip
    comm = collectives.Communicator(world)
    if world.rank == 0:
        loops = f"{args.calls} calls x {args.rounds} rounds"
        print(f"# {world.size} ranks, {args.array} float32 sum in place; {loops}")
        columns = ("ours(us)", "ring(us)", "mpi(us)", "ours/mpi", "busbw(GB/s)")
        print(f"# {'size':>10} " + " ".join(f"{name:>11}" for name in columns))
        sys.stdout.flush()
    size = max(args.minbytes, 4)
    while size <= args.maxbytes:
        count = size // 4
        _check(xp, comm, world, count)
        x = xp.zeros(count, xp.float32)  # zeros: repeated sums in place stay exact
        contenders = _contenders(xp, synchronize, comm, world, x)
        for body in contenders.values():  # warm up: plans, pinned buffers, IPC handles
            body()
        medians = interleaved_medians(world, contenders, args.rounds, args.calls)
        if world.rank == 0:
            ours, mpi = medians["ours"], medians["mpi"]
            busbw = 2 * (world.size - 1) / world.size * size / ours / 1e9
            ring = medians["ring"]
            figures = (
                f"{ours * 1e6:.1f}",
                f"{ring * 1e6:.1f}",
                f"{mpi * 1e6:.1f}",
                f"{ours / mpi:.2f}",
                f"{busbw:.2f}",
            )
            print(f"  {size:>10} " + " ".join(f"{figure:>11}" for figure in figures))
            sys.stdout.flush()
        del x, contenders
        size *= args.stepfactor
    if world.rank == 0 and xp is not np:
        print(f"# device path: {comm.device_path}")
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
