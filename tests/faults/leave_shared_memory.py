"""Run under mpiexec: the last rank is killed in a shared-memory allreduce; each rank wrote what it mapped.

Usage: ``python -m tests.faults.leave_shared_memory FOLDER``. After the first
allreduce each rank writes the /dev/shm files it maps to ``FOLDER/rank-<r>.txt``;
in the second, the last rank SIGKILLs itself on arriving at the executor's second
barrier, with the others inside the collective.
"""

import os
import signal
import sys
from pathlib import Path
from typing import Any

import numpy as np

import collectives


def _mapped() -> list[str]:
    with open("/proc/self/maps") as maps:
        paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "/dev/shm/" in line}
    return sorted(p.removesuffix(" (deleted)") for p in paths)


def main(folder: str) -> None:
    comm = collectives.Communicator(timeout=5.0)
    rank, last = comm.rank, comm.size - 1
    x = np.ones(1 << 20, np.float32)
    collectives.allreduce(x, algorithm="shared_memory", comm=comm)
    Path(folder, f"rank-{rank}.txt").write_text("\n".join(_mapped()) + "\n")
    if rank == last:
        shared = comm.transport.shared_memory()
        assert shared is not None, "the ranks share no memory"
        arrive, arrived = shared.arrive, 0

        def dying_at_barrier(note: Any = ()) -> None:
            nonlocal arrived
            arrived += 1
            if arrived == 2:
                print(f"rank {rank}: killed mid-collective", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            arrive(note)

        shared.arrive = dying_at_barrier  # type: ignore[method-assign]
    collectives.allreduce(x, algorithm="shared_memory", comm=comm)


if __name__ == "__main__":
    main(sys.argv[1])
