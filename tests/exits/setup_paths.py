"""Run under mpiexec: a setup one rank never takes part in; the others must raise in time, not hang.

Usage: ``python -m tests.exits.setup_paths CASE``, CASE one of:

* ``alloc_first`` (2 ranks): rank 0's first ``comm.alloc`` (the node split), rank 1 never calls it.
* ``alloc_second`` (2 ranks): both allocate once; rank 0's second ``alloc`` (a window) is alone.
* ``sibling`` (2 ranks): rank 0 asks for ``comm.sibling()`` (MPI's ``Comm_dup``), rank 1 never does.
* ``store`` (2 ranks): rank 0 makes a store on a Communicator (MPI's ``Comm_dup``), rank 1 never does.
* ``new_group`` (3 ranks): rank 0 asks torch for the group [0, 1], ranks 1 and 2 for [0, 1, 2].

Each rank prints ``RAISED <rank> <error type> <seconds>: <message>`` or ``MADE <rank>``, then ``DONE <rank>``.
"""

import sys
import time
from datetime import timedelta

from mpi4py import MPI

import collectives
from collectives import kvstore

TIMEOUT_S = 2.0
"""The communicators' and groups' timeout."""

LATE_S = 4.0
"""How long the rank that never calls waits before it ends (after the others' timeout)."""


def _alone(case: str) -> None:
    comm = collectives.Communicator(timeout=TIMEOUT_S)
    if case == "alloc_second":
        comm.alloc(10)
    if comm.rank == 0:
        setups = {"sibling": comm.sibling, "store": lambda: kvstore.create("sync", comm=comm, servers=1)}
        _attempt(0, setups.get(case, lambda: comm.alloc(10)))
    else:
        time.sleep(TIMEOUT_S + LATE_S)


def _new_group() -> None:
    import torch.distributed as dist

    import collectives.torch_integration  # noqa: F401 - registers the backend

    rank = MPI.COMM_WORLD.Get_rank()
    dist.init_process_group("collectives", init_method="mpi://")
    members = [0, 1] if rank == 0 else [0, 1, 2]
    limit = timedelta(seconds=TIMEOUT_S)
    _attempt(rank, lambda: dist.new_group(members, backend="collectives", timeout=limit))


def _attempt(rank: int, setup: object) -> None:
    started = time.monotonic()
    try:
        setup()  # type: ignore[operator]
        print(f"MADE {rank}", flush=True)
    except collectives.CollectivesError as error:
        print(f"RAISED {rank} {type(error).__name__} {time.monotonic() - started:.2f}: {error}", flush=True)


def main(case: str) -> None:
    if case in ("alloc_first", "alloc_second", "sibling", "store"):
        _alone(case)
    elif case == "new_group":
        _new_group()
    else:
        raise SystemExit(f"unknown case {case!r}")
    print(f"DONE {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
