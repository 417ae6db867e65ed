"""The cost of the mismatch check and the bounded waits: ``bench guard_cost`` under mpiexec.

Times allreduce of 8 B and 1 MiB on four communicators of the same ranks (the
check on or off, the timeout on or off), interleaved round by round in one run
so that a noisy machine weighs on each alike, and prints each variant's median
time and its ratio to the one with neither.
"""

__all__ = ["main"]

import argparse
import statistics
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives

VARIANTS: dict[str, dict[str, Any]] = {
    "check+timeout": {"check": True, "timeout": None},
    "check": {"check": True, "timeout": 0, "stall_warning": 0},
    "timeout": {"check": False, "timeout": None},
    "neither": {"check": False, "timeout": 0, "stall_warning": 0},
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench guard_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-r", "--rounds", type=int, default=30, help="interleaved rounds (default 30)")
    parser.add_argument("-n", "--iters", type=int, default=200, help="8 B calls per sample (default 200)")
    args = parser.parse_args(argv)
    rounds, iterations = args.rounds, args.iters
    world = MPI.COMM_WORLD
    comms = {name: collectives.Communicator(world, **settings) for name, settings in VARIANTS.items()}
    for nbytes in (8, 1 << 20):
        x = np.ones(nbytes // 4, np.float32)
        out = np.empty_like(x)
        times: dict[str, list[float]] = {name: [] for name in VARIANTS}
        reps = iterations if nbytes < 4096 else max(iterations // 10, 10)
        for _ in range(rounds):
            for name, comm in comms.items():
                world.Barrier()
                start = time.perf_counter()
                for _ in range(reps):
                    collectives.allreduce(x, out=out, algorithm="ring", comm=comm)
                elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
                times[name].append(elapsed / reps)
        if world.rank == 0:
            base = statistics.median(times["neither"])
            for name in VARIANTS:
                median = statistics.median(times[name])
                row = f"{world.size} ranks {nbytes:>8} B  {name:<14} {median * 1e6:9.1f} us"
                print(f"{row}  x{median / base:.2f}")
            sys.stdout.flush()
    for comm in comms.values():
        comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
