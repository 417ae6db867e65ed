"""Run under mpiexec -n 2: a real SIGINT lands in rank 1's loop of repeated calls; no result is ever wrong.

Usage: ``python -m tests.exits.sigint_loop COLLECTIVE ROUNDS CALLS``, COLLECTIVE ``allreduce`` or
``allgather``. Each round makes a communicator and runs CALLS calls of one shape, each on new
data; threads of rank 1 send its process a few SIGINTs at random moments. The interrupt is raised
only while the main thread is inside a call (between the line before the call and the line after
it), as a user's Ctrl-C meets a loop that spends its time in the calls. The loop catches
``KeyboardInterrupt`` and runs the same call again: a call that left no trace pairs with the
peer's, and one that broke the communicator raises ``BrokenCommunicatorError``, which ends the
round. Each rank prints ``ROUND {json}`` per round: calls done, wrong results, interrupts, and
the error that ended it.
"""

import json
import random
import signal
import sys
import threading
import time
from types import FrameType

import numpy as np
from mpi4py import MPI

import collectives

COUNT = 16
VICTIM = 1
SIGNALS = 3  # a round's SIGINTs


def main(collective: str, rounds: int, calls: int) -> None:
    world = MPI.COMM_WORLD
    rank, size = world.rank, world.size
    inside = False

    def interrupt(signum: int, frame: FrameType | None) -> None:
        if inside:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    x = np.empty(COUNT, np.float32)
    rng = random.Random(rank)
    took = 0.01  # the last round's loop, in seconds
    for round_ in range(rounds):
        comm = collectives.Communicator(world, timeout=10.0)
        collectives.allreduce(x, comm=comm)  # set up before the clock
        if rank == VICTIM:  # a few: a repeated call runs in the compiled engine, where no Python runs to
            for _ in range(SIGNALS):  # interrupt, so a SIGINT that comes then is handled after it returned
                delay = rng.uniform(0.0, 0.8 * took)  # within the loop, mostly
                threading.Timer(
                    delay, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT)
                ).start()
        done = wrong = interrupts = 0
        ended = ""
        i = 0
        began = time.monotonic()
        while i < calls:
            x[...] = rank + 1 + i
            result = None
            try:
                inside = True
                result = _call(collective, x, comm)
                inside = False
            except KeyboardInterrupt:
                inside = False
                interrupts += 1
                continue  # the call did not return: run it again
            except collectives.CollectivesError as error:
                inside = False
                ended = f"{type(error).__name__}: {error}"
                break
            expected = (
                np.full(COUNT, size * (size + 1) / 2 + size * i, np.float32)
                if collective == "allreduce"
                else np.repeat(np.arange(1, size + 1, dtype=np.float32) + i, COUNT)
            )
            if not np.array_equal(np.ravel(result), expected):
                wrong += 1
            done += 1
            i += 1
        if done == calls:
            took = time.monotonic() - began
        time.sleep(took)  # the timer has fired by now, wherever the loop was
        world.Barrier()
        comm.free()
        record = {"rank": rank, "round": round_, "done": done, "wrong": wrong, "interrupts": interrupts}
        print("ROUND " + json.dumps({**record, "ended": ended[:300]}), flush=True)


def _call(collective: str, x: np.ndarray, comm: collectives.Communicator) -> object:
    if collective == "allreduce":
        return collectives.allreduce(x, comm=comm)
    return collectives.allgather(x, comm=comm)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
