"""The cost of the mismatch check and the bounded waits: ``mpiexec -n 2 python -m bench.guard_cost``.

Times allreduce of 8 B and 1 MiB on four communicators of the same ranks (the
check on or off, the timeout on or off), interleaved round by round in one run
so that a noisy machine weighs on each alike, and prints each variant's median
time and its ratio to the one with neither.
"""

__all__ = ["main"]

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives

VARIANTS = {
    "check+timeout": {"check": True, "timeout": None},
    "check": {"check": True, "timeout": 0, "stall_warning": 0},
    "timeout": {"check": False, "timeout": None},
    "neither": {"check": False, "timeout": 0, "stall_warning": 0},
}


def main(rounds: int = 30, iterations: int = 200) -> None:
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


if __name__ == "__main__":
    main()
