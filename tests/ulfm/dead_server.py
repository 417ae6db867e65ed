"""Run under Open MPI's ``mpiexec --with-ft ulfm -n 3``: a key-value server dies, the workers are told so.

Usage: ``python -m tests.ulfm.dead_server dedicated|colocated``. Rank 2 is a server (a
dedicated one, or colocated with a worker) of an ``async`` store; once key ``"w"`` is
made on every server, rank 2 dies (SIGKILL). Each survivor then pushes and pulls
``"w"`` and closes the store, and prints ``DEAD {json}``: the type and text of the
error each raised (``None`` where none) and the seconds both took.
"""

import json
import os
import signal
import sys
import threading
import time

import numpy as np
from mpi4py import MPI

from collectives import kvstore

TIMEOUT_S = 5.0


def _error(call) -> dict[str, str] | None:  # type: ignore[no-untyped-def]
    try:
        call()
    except Exception as error:
        return {"type": type(error).__name__, "text": str(error)}
    return None


def main(servers: str) -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    dedicated = servers == "dedicated"
    if dedicated and rank == 2:  # serves inside create: dies once worker 0 says the key is made

        def die() -> None:
            MPI.COMM_WORLD.recv(source=0, tag=99)
            os.kill(os.getpid(), signal.SIGKILL)

        threading.Thread(target=die, daemon=True).start()
    kv = kvstore.create("async", servers=1 if dedicated else None, timeout=TIMEOUT_S, partition_bytes=16)
    kv.init("w", np.zeros(12, np.float32))  # 3 partitions: one on every server
    kv.barrier()  # every worker's init answered, before the server dies (else init raises, not the calls)
    if dedicated and rank == 0:
        MPI.COMM_WORLD.send(None, dest=2, tag=99)
    if not dedicated and rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(2.0)  # rank 2 is gone
    began = time.monotonic()
    seen = {"rank": rank, "push_pull": _error(lambda: (kv.push("w", np.ones(12, np.float32)), kv.pull("w")))}
    seen["close"] = _error(kv.close)
    seen["seconds"] = time.monotonic() - began
    print("DEAD " + json.dumps(seen), flush=True)
    os._exit(0)  # MPI_Finalize would wait for the dead rank


if __name__ == "__main__":
    main(sys.argv[1])
