"""Run under Open MPI's ``mpiexec --with-ft ulfm``: what MPI itself does when a rank dies (mpi4py alone).

Usage: ``python -m tests.ulfm.probe kill|exit0``. The last rank leaves (SIGKILL, or
``os._exit(0)`` without finalizing) after a barrier; each survivor then tries a
blocking allreduce, a nonblocking one and a nonblocking send and receive to it (with
statuses and without), each on a duplicate of ``MPI.COMM_WORLD`` (errors returned),
then revokes, acknowledges, agrees and shrinks, and prints one ``PROBE {json}`` line.
"""

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI


def _attempt(operation) -> dict[str, object]:  # type: ignore[no-untyped-def]
    began = time.monotonic()
    try:
        operation()
    except MPI.Exception as error:
        return {"error": MPI.Get_error_string(error.Get_error_class()).split(":")[0],
                "seconds": time.monotonic() - began}  # fmt: skip
    return {"error": None, "seconds": time.monotonic() - began}


def main(how: str) -> None:
    world = MPI.COMM_WORLD
    blocking, nonblocking, p2p = (world.Dup() for _ in range(3))
    for comm in (blocking, nonblocking, p2p):
        comm.Set_errhandler(MPI.ERRORS_RETURN)
    rank, victim = world.Get_rank(), world.Get_size() - 1
    world.Barrier()
    if rank == victim:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(0)
    x, y = np.ones(4), np.full(4, -1.0)
    seen: dict[str, object] = {"rank": rank}
    seen["blocking"] = _attempt(lambda: blocking.Allreduce(x, y))
    seen["nonblocking"] = _attempt(lambda: nonblocking.Iallreduce(x, y).Wait())
    # with statuses a dead peer's error shows; without (MPI_STATUSES_IGNORE) Open MPI 5.0.x may
    # complete the receive as if it had succeeded, so the transport passes statuses under ULFM
    statuses = [MPI.Status(), MPI.Status()]
    seen["p2p"] = _attempt(
        lambda: MPI.Request.Waitall([p2p.Irecv(y, victim, 7), p2p.Isend(x, victim, 7)], statuses)
    )
    seen["p2p_status_errors"] = [s.Get_error() for s in statuses]
    seen["p2p_received"] = y.tolist()
    seen["p2p_statuses_ignored"] = _attempt(
        lambda: MPI.Request.Waitall([p2p.Irecv(y, victim, 8), p2p.Isend(x, victim, 8)])
    )
    blocking.Revoke()
    seen["revoked"] = _attempt(lambda: blocking.Allreduce(x, y))
    blocking.Ack_failed()
    failed = blocking.Get_failed()
    seen["failed"] = MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())), blocking.Get_group())
    seen["agreed"] = blocking.Agree(5 if rank == 0 else 7)  # bitwise and over the survivors
    smaller = blocking.Shrink()
    total = np.zeros(4)
    smaller.Allreduce(x, total)
    seen["shrunk"] = {"size": smaller.Get_size(), "rank": smaller.Get_rank(), "sum": float(total[0])}
    print("PROBE " + json.dumps(seen), flush=True)
    # MPI_Finalize after a death spins for good now and then (about one job in five): skip it,
    # as collectives.resilience does after a recovery
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
