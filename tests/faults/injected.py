"""Run under mpiexec: collectives in a loop that ``$COLLECTIVES_FAULT`` fails, or in-memory checkpoints.

Usage: ``python -m tests.faults.injected calls`` (ten allreduces, then a line saying
they all completed), or ``python -m tests.faults.injected replicas`` (each rank
checkpoints its state three times; every rank checks the copies it keeps and
rank 0 prints whether all did).
"""

import sys

import numpy as np

import collectives
from collectives.resilience import Checkpointer

TIMEOUT_S = 5.0  # the survivors' collective timeout


def calls(comm: collectives.Communicator) -> None:
    x = np.ones(16, np.float32)
    for _ in range(10):
        collectives.allreduce(x, comm=comm)
    print(f"rank {comm.rank}: all calls completed", flush=True)


def replicas(comm: collectives.Communicator) -> None:
    ck = Checkpointer(comm, replicas=2)
    for step in range(3):
        ck.checkpoint({"rank": comm.rank, "step": step, "w": np.full(1000, comm.rank + step, np.float64)})
    good = ck.version == 3 and ck.load()["rank"] == comm.rank
    for owner in ck.held:
        copy = ck.replica_of(owner)
        good = good and copy["rank"] == owner and copy["step"] == 2
        good = good and bool(np.array_equal(copy["w"], np.full(1000, owner + 2, np.float64)))
    size = comm.size
    good = good and sorted(ck.held) == sorted({comm.rank, (comm.rank - 1) % size, (comm.rank - 2) % size})
    verdict = collectives.allreduce(np.array([int(good)], np.int32), op="min", comm=comm)
    if comm.rank == 0:
        print(f"replicas {'ok' if verdict[0] == 1 else 'WRONG'} on {size} ranks", flush=True)


def main(what: str) -> None:
    comm = collectives.Communicator(timeout=TIMEOUT_S)
    {"calls": calls, "replicas": replicas}[what](comm)


if __name__ == "__main__":
    main(*sys.argv[1:])
