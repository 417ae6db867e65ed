"""Run under Open MPI's ``mpiexec --with-ft ulfm`` with ``$COLLECTIVES_FAULT``: survive deaths in one family.

Usage: ``python -m tests.ulfm.survive FAMILY ROUNDS REPLICAS [TIMEOUT_S]``, FAMILY one of ``ring``,
``tree``, ``shared_memory`` (allreduces of that algorithm) or ``rooted`` (broadcast,
reduce, gather and scatter in turn, with roots that move). Each rank owns one piece of
state (its own launch rank), checkpointed in memory with ``REPLICAS`` copies. When a
collective raises, the survivors recover (shrink, go back to the checkpoint, take over
the lost ranks' pieces, checkpoint again) and go on until ``ROUNDS`` calls succeeded
on every survivor. Then every family, and a key-value store, run on the last
communicator, and each survivor prints one ``SURVIVED {json}`` line: its launch rank,
the pieces it owns, the errors it saw, and whether each family's results were right.
"""

import json
import sys
from typing import Any

import numpy as np

import collectives
from collectives import kvstore
from collectives.errors import BrokenCommunicatorError, CollectiveTimeout
from collectives.resilience import Checkpointer, hung_ranks, recover

TIMEOUT_S = 20.0


def _one_call(family: str, comm: collectives.Communicator, round_: int) -> bool:
    """One collective of ``family``; whether its result is right on this rank."""
    rank, size = comm.rank, comm.size
    x = np.full(1000, rank + 1, np.float64)
    total = size * (size + 1) / 2
    if family in ("ring", "tree", "shared_memory"):
        return bool(np.all(collectives.allreduce(x, algorithm=family, comm=comm) == total))
    root = round_ % size
    kind = round_ % 4
    if kind == 0:
        got = collectives.broadcast(np.full(10, root + 1, np.float64), root=root, comm=comm)
        return bool(np.all(got == root + 1))
    if kind == 1:
        got = collectives.reduce(x, root=root, comm=comm)
        return rank != root or bool(np.all(got == total))
    if kind == 2:
        got = collectives.gather(np.full(3, rank, np.int64), root=root, comm=comm)
        return rank != root or got.tolist() == [r for r in range(size) for _ in range(3)]
    share = np.repeat(np.arange(size, dtype=np.int64), 2) if rank == root else np.zeros(2 * size, np.int64)
    return bool(np.all(collectives.scatter(share, root=root, comm=comm) == rank))


def _every_family(comm: collectives.Communicator) -> dict[str, bool]:
    right = {family: _one_call(family, comm, 0) for family in ("ring", "tree", "shared_memory")}
    right["rooted"] = all(_one_call("rooted", comm, k) for k in range(4 * comm.size))
    size = comm.size
    got = collectives.allgather(np.full(2, comm.rank, np.int64), comm=comm)
    right["allgather"] = got.tolist() == [r for r in range(size) for _ in range(2)]
    got = collectives.reduce_scatter(np.ones(2 * size, np.float64), comm=comm)
    right["reduce_scatter"] = bool(np.all(got == size))
    collectives.barrier(comm=comm)
    store = kvstore.create("sync", comm=comm, timeout=TIMEOUT_S)
    store.init("w", np.zeros(100, np.float32))
    pulled = store.pushpull("w", np.ones(100, np.float32))
    right["kvstore"] = bool(np.all(pulled == size))  # no updater: the servers keep the pushes' sum
    store.close()
    return right


def main(family: str, rounds: int, replicas: int, timeout: float = TIMEOUT_S) -> None:
    comm = collectives.Communicator(timeout=timeout)
    launch = [*range(comm.size)]  # launch rank of each rank of the current communicator
    me = comm.rank
    checkpointer = Checkpointer(comm, replicas=replicas)
    state: dict[str, Any] = {"pieces": [me]}
    checkpointer.checkpoint(state)
    errors: list[str] = []
    wrong = 0
    done = 0
    while done < rounds:
        try:
            wrong += not _one_call(family, comm, done)
            done += 1
        except (BrokenCommunicatorError, CollectiveTimeout) as error:
            errors.append(f"{type(error).__name__}: {error}")
            recovery = recover(checkpointer, hung=hung_ranks(error))  # a hung rank is killed
            comm, checkpointer = recovery.communicator, recovery.checkpointer
            launch = [launch[old] for old in recovery.survivors]
            state = recovery.state()
            for piece in recovery.adopted.values():
                state["pieces"] += piece["pieces"]
            checkpointer.checkpoint(state)
            done = 0  # the rounds start again on the new communicator, from the checkpoint
    right = _every_family(comm)
    pieces = collectives.allgather(
        np.array(sorted(state["pieces"]) + [-1] * (8 - len(state["pieces"]))), comm=comm
    )
    seen = {
        "rank": me,
        "size": comm.size,
        "launch": launch,
        "pieces": sorted(state["pieces"]),
        "all_pieces": sorted(int(p) for p in pieces if p >= 0),
        "errors": errors,
        "wrong": wrong,
        "right": right,
    }
    print("SURVIVED " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *map(float, sys.argv[4:5]))
