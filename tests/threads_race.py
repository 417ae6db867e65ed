"""Two threads call one collective at once on one communicator (or one store), many times; run under mpiexec.

Each rank's two threads contribute values no other (rank, thread) does, so any result is
recognisable: a right one is, in every element, the sum of exactly one call's value per rank.
Each rank prints one line ``RESULT {json}`` with what it saw; the test reads them.

Usage: ``mpiexec -n 2 python -m tests.threads_race MODE RUNS`` with MODE ``allreduce`` or ``store``.
"""

import contextlib
import json
import random
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
import collectives.kvstore
from collectives import BrokenCommunicatorError, ConcurrentCallError, KVStoreError

WORLD = MPI.COMM_WORLD
_jitter = random.Random(WORLD.rank)
TIMEOUT_S = 20.0
ALGORITHMS = ("shared_memory", "auto", "ring")
COUNTS = (8, 50_000)  # with the signature (the prepared path), and past it


def _value(rank: int, thread: int) -> float:
    """A power of two per (rank, thread): every sum of one value per rank is a different number."""
    return float(2 ** (2 * rank + thread))


def _right_sums(size: int) -> set[float]:
    sums = {0.0}
    for rank in range(size):
        sums = {s + _value(rank, t) for s in sums for t in (0, 1)}
    return sums


def _two_threads(call: Callable[[int], Any]) -> list[Any]:
    """``call(0)`` and ``call(1)`` on two threads released together; each one's result or error."""
    start = threading.Barrier(2)
    outcomes: list[Any] = [None, None]

    def one(thread: int) -> None:
        start.wait()
        time.sleep(_jitter.random() * 2e-4)  # either thread may go first, on each rank its own way
        try:
            outcomes[thread] = call(thread)
        except BaseException as error:  # every outcome is judged below
            outcomes[thread] = error

    threads = [threading.Thread(target=one, args=(t,), name=f"caller-{t}") for t in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(4 * TIMEOUT_S)
    if any(thread.is_alive() for thread in threads):
        return [TimeoutError("a caller did not return")] * 2
    return outcomes


def _summary(outcome: Any, allowed: tuple[type[BaseException], ...]) -> Any:
    """What a call gave, as every rank can compare: its one value, ``"refused"``, or a problem's text."""
    if isinstance(outcome, allowed):
        return "refused"
    if isinstance(outcome, BaseException):
        return f"raised {type(outcome).__name__}: {outcome}"[:300]
    values = np.unique(np.asarray(outcome)).tolist()
    return float(values[0]) if len(values) == 1 else f"mixed values {values[:6]}"


def _judge(runs: list[list[list[Any]]], seen: dict[str, Any], same_thread: bool) -> None:
    """Count right, refused and wrong calls; ``runs[run][rank][thread]`` is a call's summary.

    A call that returned is right when its value is the sum of one call's data per rank, its
    own call's among them, and each of those other calls returned the same value or raised:
    an allreduce gives every rank of it one result. With ``same_thread`` (the store, where a
    thread's key is its own) the other calls must be of the same thread, that is the same key.
    """
    size = len(runs[0])
    for run, ranks in enumerate(runs):
        for rank, threads in enumerate(ranks):
            for thread, got in enumerate(threads):
                if got == "refused":
                    seen["refused"] += 1
                    continue
                partners = _partners(got, size)
                where = f"run {run} rank {rank} thread {thread}: {got}"
                if partners is None or partners[rank] != thread:
                    seen["wrong"].append(where)
                elif same_thread and set(partners) != {thread}:
                    seen["wrong"].append(f"{where}: other keys' data, from threads {partners}")
                elif any(ranks[q][partners[q]] not in (got, "refused") for q in range(size)):
                    theirs = [ranks[q][partners[q]] for q in range(size)]
                    seen["wrong"].append(f"{where}: the calls it summed gave {theirs}")
                else:
                    seen["right"] += 1


def _partners(got: Any, size: int) -> list[int] | None:
    """The thread each rank's contribution to ``got`` came from; ``None`` if it is no such sum."""
    if not isinstance(got, float) or got != int(got):
        return None
    bits = int(got)
    partners = []
    for rank in range(size):
        mine = [t for t in (0, 1) if bits >> (2 * rank + t) & 1]
        if len(mine) != 1:
            return None
        partners.append(mine[0])
    return partners if bits >> (2 * size) == 0 else None


def _allreduce_run(run: int) -> list[Any]:
    """One run: a new communicator, set up, then two threads' allreduce at once; their summaries."""
    algorithm = ALGORITHMS[run % len(ALGORITHMS)]
    count = COUNTS[(run // len(ALGORITHMS)) % len(COUNTS)]
    comm = collectives.Communicator(WORLD, timeout=TIMEOUT_S)
    warm = np.ones(count, np.float64)
    for _ in range(2):  # set up (nodes, shared memory, the prepared call) before the race
        collectives.allreduce(warm, algorithm=algorithm, comm=comm)
    data = [np.full(count, _value(WORLD.rank, t), np.float64) for t in (0, 1)]
    outcomes = _two_threads(lambda t: collectives.allreduce(data[t], algorithm=algorithm, comm=comm))
    return [_summary(o, (ConcurrentCallError, BrokenCommunicatorError)) for o in outcomes]


def _store_run(run: int) -> list[Any]:
    """One run: a new ``sync`` store with keys a and b, then thread 0 pushpulls a and thread 1 b at once."""
    count = COUNTS[run % len(COUNTS)]
    # short: a round one thread ran alone on one rank waits for the timeout
    store = collectives.kvstore.create("sync", comm=WORLD, timeout=2.0)
    for key in ("a", "b"):
        store.init(key, np.zeros(count, np.float64))
    data = [np.full(count, _value(WORLD.rank, t), np.float64) for t in (0, 1)]
    outs = [np.empty(count, np.float64) for _ in (0, 1)]

    def pushpull(t: int) -> Any:
        store.pushpull(("a", "b")[t], data[t], out=outs[t])
        return outs[t]

    outcomes = _two_threads(pushpull)
    with contextlib.suppress(KVStoreError):
        store.close()
    return [_summary(o, (ConcurrentCallError, BrokenCommunicatorError, KVStoreError)) for o in outcomes]


def main() -> None:
    mode, runs = sys.argv[1], int(sys.argv[2])
    one = _allreduce_run if mode == "allreduce" else _store_run
    summaries = []
    for run in range(runs):
        summaries.append(WORLD.allgather(one(run)))  # every rank done with the run before the next
    seen: dict[str, Any] = {"right": 0, "refused": 0, "wrong": []}
    _judge(summaries, seen, same_thread=mode == "store")
    print("RESULT " + json.dumps({"rank": WORLD.rank, **seen}), flush=True)


if __name__ == "__main__":
    main()
