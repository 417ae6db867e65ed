"""Recovery time after a rank's death under Open MPI with ULFM: failure to the next completed step.

Run under Open MPI's launcher with fault tolerance on::

    mpiexec --oversubscribe --with-ft ulfm -n 4 python -m collectives bench recovery --state-mib 1,16

For each state size, one launch-long training loop of allreduces of ``--count`` float32
with an in-memory checkpoint of ``--state-mib`` MiB per rank every ``--every`` steps; at
step ``--kill-at`` the last rank kills itself (SIGKILL). The survivors time how long the
failed step took to raise (detect), :func:`collectives.resilience.recover` (shrink, go back,
take over the lost state, checkpoint again), and the failure to the next completed step.
Each size needs a launch of its own (a rank dies in each): give one size per launch.
Rank 0 prints one row: the slowest survivor's times in milliseconds.
"""

__all__ = ["main"]

import argparse
import os
import signal
import sys
import time
from typing import Any

import numpy as np

import collectives
from collectives.errors import BrokenCommunicatorError, CollectiveTimeout
from collectives.resilience import Checkpointer, recover

from .table import Column, Table

_TIMES = ("detect(ms)", "recover(ms)", "to_next_step(ms)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench recovery", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--state-mib", type=float, default=1.0, help="checkpointed state per rank, MiB")
    parser.add_argument("--count", type=int, default=1 << 18, help="float32 elements per allreduce")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=5, help="checkpoint every this many steps")
    parser.add_argument("--kill-at", type=int, default=12, help="the step at which the last rank dies")
    args = parser.parse_args(argv)
    comm = collectives.Communicator(timeout=60.0)
    ranks, victim = comm.size, comm.size - 1
    checkpointer = Checkpointer(comm, replicas=1)
    state: dict[str, Any] = {"step": 0, "data": np.zeros(int(args.state_mib * (1 << 20)) // 8)}
    checkpointer.checkpoint(state)
    x = np.ones(args.count, np.float32)
    times = np.zeros(3)
    failed_at = None
    while state["step"] < args.steps:
        began = time.perf_counter()
        if comm.rank == victim and state["step"] == args.kill_at and failed_at is None:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            collectives.allreduce(x, comm=comm)
        except (BrokenCommunicatorError, CollectiveTimeout):
            failed_at = time.perf_counter()
            times[0] = failed_at - began
            recovery = recover(checkpointer)
            comm, checkpointer = recovery.communicator, recovery.checkpointer
            state = recovery.state()
            checkpointer.checkpoint(state)
            times[1] = time.perf_counter() - failed_at
            continue
        state["step"] += 1
        if failed_at is not None and not times[2]:
            times[2] = time.perf_counter() - failed_at
        if state["step"] % args.every == 0:
            checkpointer.checkpoint(state)
    slowest = collectives.allreduce(times, op="max", comm=comm) * 1e3
    if comm.rank == 0:
        table = Table([Column("ranks"), Column("state(MiB)", "g"), *(Column(t, ".1f") for t in _TIMES)])
        print("\n".join(table.lines([(ranks, args.state_mib, *slowest)])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
