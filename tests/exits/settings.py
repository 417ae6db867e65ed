"""Run under mpiexec: ranks made with settings that differ, or are unusable; every rank must raise at once.

Usage: ``python -m tests.exits.settings SETTING...``, each ``RANK:NAME=VALUE`` (``*`` for every
rank): an environment variable set on that rank before the library is imported, or
``check``/``tune`` for the Communicator's argument (``0`` or ``1``).

Each rank makes a Communicator, then runs three allreduces of 4 MiB and checks their sums.
It prints ``RAISED <rank> <error type> <seconds>: <message>`` where either raised, else
``SUMS <rank> <wrong elements>``; then ``DONE <rank>``.
"""

import os
import sys
import time

from mpi4py import MPI

TIMEOUT_S = 5.0
"""The communicator's timeout: a case that waits on a peer ends in this long."""

_ARGUMENTS = ("check", "tune")


def _settings(rank: int, given: list[str]) -> dict[str, bool]:
    """Set this rank's environment variables; the Communicator's arguments."""
    arguments = {}
    for setting in given:
        which, _, assignment = setting.partition(":")
        name, _, value = assignment.partition("=")
        if which not in ("*", str(rank)):
            continue
        if name in _ARGUMENTS:
            arguments[name] = value == "1"
        else:
            os.environ[name] = value
    return arguments


def main() -> None:
    rank = MPI.COMM_WORLD.Get_rank()
    arguments = _settings(rank, sys.argv[1:])
    import numpy as np

    import collectives

    started = time.monotonic()
    try:
        comm = collectives.Communicator(timeout=TIMEOUT_S, **arguments)  # type: ignore[arg-type]
        wrong = 0
        for _ in range(3):
            x = np.full(1 << 20, comm.rank + 1, dtype=np.float32)
            collectives.allreduce(x, out=x, comm=comm)
            wrong += int(np.count_nonzero(x != comm.size * (comm.size + 1) // 2))
        print(f"SUMS {rank} {wrong}", flush=True)
        comm.free()
    except (collectives.CollectivesError, ValueError, OverflowError) as error:
        print(f"RAISED {rank} {type(error).__name__} {time.monotonic() - started:.2f}: {error}", flush=True)
    print(f"DONE {rank}", flush=True)


if __name__ == "__main__":
    main()
