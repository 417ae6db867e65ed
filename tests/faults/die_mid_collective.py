"""Run under mpiexec: the last rank dies in the middle of its second allreduce; the job must end, not hang.

Usage: ``python -m tests.faults.die_mid_collective exit|kill|hang``. ``exit`` leaves by
``os._exit(3)``, ``kill`` by SIGKILL, and ``hang`` sleeps for good without
dying, so the others can only end by their own timeout.
"""

import os
import signal
import sys
import time
from typing import Any

import numpy as np

import collectives

TIMEOUT_S = 5.0  # the survivors' collective timeout


def main(how: str) -> None:
    comm = collectives.Communicator(timeout=TIMEOUT_S)
    rank, last = comm.rank, comm.size - 1
    x = np.ones(1 << 16, np.float32)
    collectives.allreduce(x, algorithm="ring", comm=comm)
    if rank == last:
        transport = comm.transport
        send = transport.isend
        sent = 0

        def dying(buffer: Any, dst: int, tag: int) -> Any:
            nonlocal sent
            sent += 1
            if sent == 3:  # after the signatures and the first step's send: mid-collective
                print(f"rank {rank}: dying ({how})", flush=True)
                if how == "exit":
                    os._exit(3)
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(3600)
            return send(buffer, dst, tag)

        transport.isend = dying  # type: ignore[method-assign]
    collectives.allreduce(x, algorithm="ring", comm=comm)
    print(f"rank {rank}: the allreduce completed without rank {last}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
