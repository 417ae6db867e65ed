"""What a checkpoint costs, by the size of each rank's state: ``bench checkpoint`` under mpiexec.

Per size, the median over rounds of the slowest rank's time of:

* ``serialize``: the state to bytes alone (:func:`collectives.resilience.serial.dumps`: a
  pickle whose arrays' memory is copied once, out of band), the floor of both kinds;
* ``memory``: :meth:`Checkpointer.checkpoint <collectives.resilience.Checkpointer.checkpoint>`
  with one replica (agree on sizes and version, copy to the next rank);
* ``directory``: :func:`collectives.resilience.save` (a file per rank, synced,
  renamed, then the manifest) into ``--dir`` (a temporary folder by default);
* ``load``: :func:`collectives.resilience.load` of that version (a relaunch's cost);
* ``allreduce``: ``collectives.allreduce`` of the same bytes, for scale.

The state is ``{"w": float32 array}``; the last column is the in-memory
checkpoint's milliseconds per MiB of state.
"""

__all__ = ["main"]

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import collectives
from collectives.resilience import Checkpointer, load, save
from collectives.resilience.serial import dumps

from .config import parse_size
from .table import Column, Table

_MIB = 1 << 20
_TIMED = ("serialize", "memory", "directory", "load", "allreduce")
_TABLE = Table(
    [Column("size", width=10), *(Column(t, ".3f", width=9) for t in _TIMED), Column("memory/MiB", ".3f")]
)
"""Times in ms; a row printed per size as it is measured."""


def _time(world: MPI.Intracomm, body: Callable[[], object], rounds: int) -> float:
    """The median over ``rounds`` of the slowest rank's seconds for ``body``."""
    samples = []
    for _ in range(rounds):
        world.Barrier()
        began = time.perf_counter()
        body()
        samples.append(world.allreduce(time.perf_counter() - began, op=MPI.MAX))
    return float(statistics.median(samples))


def _row(
    world: MPI.Intracomm, comm: collectives.Communicator, checkpointer: Checkpointer, folder: str, size: int,
    rounds: int, first_version: int,
) -> list[float]:  # fmt: skip
    """The times in ms, in the table's order, for a state of ``size`` bytes."""
    state = {"w": np.ones(size // 4, np.float32)}
    x = state["w"]
    checkpointer.checkpoint(state)  # warm up: buffers, the first calls' decisions
    collectives.allreduce(x, comm=comm)
    versions = iter(range(first_version, first_version + rounds))
    times = [
        _time(world, lambda: dumps(state), rounds),
        _time(world, lambda: checkpointer.checkpoint(state), rounds),
        _time(world, lambda: save(folder, state, next(versions), comm=comm, keep=1), rounds),
        _time(world, lambda: load(folder, comm=comm), rounds),
        _time(world, lambda: collectives.allreduce(x, comm=comm), rounds),
    ]
    return [1e3 * t for t in times]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench checkpoint", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-b", "--minbytes", default="1K", help="smallest state per rank (default 1K)")
    parser.add_argument("-e", "--maxbytes", default="64M", help="largest state per rank (default 64M)")
    parser.add_argument("-f", "--stepfactor", type=int, default=8, help="size multiplier (default 8)")
    parser.add_argument("-n", "--rounds", type=int, default=5, help="timed rounds per size (default 5)")
    parser.add_argument("--dir", help="where the directory checkpoints go (default: a temporary folder)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    comm = collectives.Communicator()
    folder = args.dir or (tempfile.mkdtemp(prefix="bench-checkpoint-") if world.rank == 0 else None)
    folder = world.bcast(folder)
    checkpointer = Checkpointer(comm, replicas=1)
    if world.rank == 0:
        print(f"# ranks: {world.size}, one replica; directory: {folder}")
        print(f"# median of {args.rounds} rounds, slowest rank; times in ms")
        print(_TABLE.header())
    size, version = parse_size(args.minbytes), 1
    while size <= parse_size(args.maxbytes):
        ms = _row(world, comm, checkpointer, folder, size, args.rounds, version)
        version += args.rounds
        if world.rank == 0:
            print(_TABLE.row(size, *ms[:5], ms[1] * _MIB / size), flush=True)
        size *= args.stepfactor
    world.Barrier()
    if world.rank == 0 and args.dir is None:
        shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
