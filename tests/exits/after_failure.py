"""Run under mpiexec -n 2: a failure on one rank, then the exits; prints how long each close or free took.

Usage: ``python -m tests.exits.after_failure CASE``, CASE one of:

* ``store_bad_input``: rank 1's ``sync`` pushpull raises on a bad ``out=``, rank 0's times out; both close.
* ``store_closed_early``: rank 1 closes the store, rank 0's next pushpull times out; both close.
* ``free_late``: rank 0's shared-memory allreduce times out; rank 1 frees the communicator only later.
* ``free_never``: as ``free_late``, but rank 1 ends without freeing it.
* ``free_dead_shared``, ``free_dead_messages`` (3 ranks, Open MPI with ULFM): the last rank dies
  (SIGKILL) after a first allreduce; the survivors' next allreduce (through shared memory, or by
  messages) fails, and they free the communicator.

Each rank prints ``TOOK <rank> <seconds>`` for its close or free, then ``DONE <rank>``.
"""

import sys
import time

import numpy as np
from mpi4py import MPI

import collectives
from collectives import kvstore

TIMEOUT_S = 2.0
"""The communicators' and stores' timeout."""

LATE_S = 6.0
"""How long after the failure rank 1 comes to free (``free_late``, ``free_never``)."""


def _closed(rank: int, close: object) -> None:
    started = time.monotonic()
    try:
        close()  # type: ignore[operator]
    except collectives.CollectivesError as error:
        print(f"rank {rank}: close raised {type(error).__name__}: {error}", flush=True)
    print(f"TOOK {rank} {time.monotonic() - started:.2f}", flush=True)


def _store(case: str) -> None:
    kv = kvstore.create("sync", timeout=TIMEOUT_S)
    rank = kv.rank
    kv.init("w", np.zeros(1000, np.float32))
    kv.pushpull("w", np.ones(1000, np.float32))  # the shared memory is set up
    if case == "store_closed_early" and rank == 1:
        _closed(rank, kv.close)
        return
    bad = case == "store_bad_input" and rank == 1
    try:
        kv.pushpull("w", np.ones(1000, np.float32), out=np.empty(1000, np.float64) if bad else None)
        print(f"rank {rank}: the pushpull did not fail", flush=True)
    except collectives.CollectivesError as error:
        print(f"rank {rank}: pushpull raised {type(error).__name__}", flush=True)
    _closed(rank, kv.close)


def _communicator(case: str) -> None:
    comm = collectives.Communicator(timeout=TIMEOUT_S)
    x = np.ones(1000, np.float32)
    collectives.allreduce(x, algorithm="shared_memory", comm=comm)
    if comm.rank == 0:
        try:
            collectives.allreduce(x, algorithm="shared_memory", comm=comm)
            print("rank 0: the allreduce did not fail", flush=True)
        except collectives.CollectiveTimeout:
            print("rank 0: allreduce raised CollectiveTimeout", flush=True)
        _closed(0, comm.free)
        return
    time.sleep(TIMEOUT_S + LATE_S)
    if case == "free_late":
        _closed(1, comm.free)


def _dead_peer(case: str) -> None:
    import os
    import signal

    comm = collectives.Communicator(timeout=TIMEOUT_S)
    algorithm = "shared_memory" if case == "free_dead_shared" else "ring"
    x = np.ones(1000, np.float32)
    collectives.allreduce(x, algorithm=algorithm, comm=comm)
    if comm.rank == comm.size - 1:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        collectives.allreduce(x, algorithm=algorithm, comm=comm)
        print(f"rank {comm.rank}: the allreduce did not fail", flush=True)
    except collectives.CollectivesError as error:
        print(f"rank {comm.rank}: allreduce raised {type(error).__name__}", flush=True)
    _closed(comm.rank, comm.free)


def main(case: str) -> None:
    if case.startswith("store_"):
        _store(case)
    elif case in ("free_late", "free_never"):
        _communicator(case)
    elif case in ("free_dead_shared", "free_dead_messages"):
        _dead_peer(case)
    else:
        raise SystemExit(f"unknown case {case!r}")
    print(f"DONE {MPI.COMM_WORLD.Get_rank()}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
