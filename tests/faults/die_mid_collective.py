"""Run under mpiexec: the last rank dies in the middle of its second allreduce; the job must end, not hang.

Usage: ``python -m tests.faults.die_mid_collective exit|kill|hang [ring|shared_memory] [TIMEOUT_S]``.
``exit`` leaves by ``os._exit(3)``, ``kill`` by SIGKILL, and ``hang`` sleeps for
good without dying, so the others can only end by their own timeout. With
``shared_memory`` the rank dies on arriving at the shared-memory executor's second
barrier instead of at its third send.
"""

import os
import signal
import sys
import time
from typing import Any

import numpy as np

import collectives

TIMEOUT_S = 5.0  # the survivors' collective timeout


def _die(rank: int, how: str) -> None:
    print(f"rank {rank}: dying ({how})", flush=True)
    if how == "exit":
        os._exit(3)
    if how == "exit0":  # a clean exit: the launcher does not end the job for it
        os._exit(0)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(3600)


def main(how: str, algorithm: str = "ring", timeout: str = str(TIMEOUT_S)) -> None:
    comm = collectives.Communicator(timeout=float(timeout))  # 0: no timeout
    rank, last = comm.rank, comm.size - 1
    x = np.ones(1 << 20, np.float32)  # past one segment of the shared-memory executor
    collectives.allreduce(x, algorithm=algorithm, comm=comm)
    if rank == last and algorithm == "shared_memory":
        shared = comm.transport.shared_memory()
        assert shared is not None, "the ranks share no memory"
        arrive = shared.arrive
        arrived = 0

        def dying_at_barrier(note: Any = ()) -> None:
            nonlocal arrived
            arrived += 1
            if arrived == 2:  # the first barrier passed: mid-collective
                _die(rank, how)
            arrive(note)

        shared.arrive = dying_at_barrier  # type: ignore[method-assign]
    elif rank == last:
        transport = comm.transport
        send = transport.isend
        sent = 0

        def dying(buffer: Any, dst: int, tag: int) -> Any:
            nonlocal sent
            sent += 1
            if sent == 3:  # after the signatures and the first step's send: mid-collective
                _die(rank, how)
            return send(buffer, dst, tag)

        transport.isend = dying  # type: ignore[method-assign]
    collectives.allreduce(x, algorithm=algorithm, comm=comm)
    print(f"rank {rank}: the allreduce completed without rank {last}", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
