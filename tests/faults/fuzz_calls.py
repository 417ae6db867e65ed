"""Random calls under mpiexec, from threads on several communicators and with interruptions.

Run by tests/test_fuzz_mpi.py as ``mpiexec -n P python -m tests.faults.fuzz_calls SEED CALLS``.
Every rank draws the same calls from the seed. Every result returned is checked
against numpy, bit for bit; every error raised must be a ``CollectivesError``.
Then, round after round, one rank's call is interrupted by a signal (as Ctrl-C
would): the ranks must either all finish that communicator's next call with the
right result (the signal came after the call) or all get a ``CollectivesError``
from it, never a wrong result. Rank 0 prints ``fuzz: N calls, M interrupted, OK``
or the problems of every rank. ``FUZZ_THREADS`` and ``FUZZ_INTERRUPTIONS`` change how
many threads call at once (2) and how many rounds are interrupted (4).
"""

import os
import signal
import sys
import threading
import traceback
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives as C
from collectives.algorithms import ALGORITHMS, base
from collectives.ops import OPS
from collectives.selector import rejection_reasons
from tests.test_fuzz import _COLLECTIVES, _REDUCING, _reference

DTYPES = ("float32", "float64", "int32", "int64", "uint8")
IN_PLACE = ("allreduce", "broadcast", "alltoall")  # out=x is the in-place form of these
THREADS = int(os.environ.get("FUZZ_THREADS", "2"))  # each on a communicator of its own
INTERRUPTIONS = int(os.environ.get("FUZZ_INTERRUPTIONS", "4"))


class Interrupted(Exception):
    """What the signal handler raises in the middle of a call, as KeyboardInterrupt would."""


def draw_call(rng: np.random.Generator, size: int) -> dict[str, Any]:
    """One call: the same on every rank, since every rank's generator has the same seed."""
    collective = str(rng.choice(_COLLECTIVES))
    dtype = str(rng.choice(DTYPES))
    op = str(rng.choice([o.name for o in OPS.values() if dtype in o.dtypes]))
    large = rng.random() < 0.1  # past the small-message paths
    per_rank = collective in ("reduce_scatter", "scatter", "alltoall")
    if per_rank:
        count = int(rng.integers(0, 20_000 if large else 7)) * size
    else:
        count = int(rng.integers(0, 100_000 if large else 20))
    valid = [name for name, module in ALGORITHMS.items() if base.implements(module, collective)]
    valid = [name for name in valid if not rejection_reasons(collective, name, size, count)]
    low = 0 if dtype.startswith("u") else -3
    # small integers: every sum and product is exact in any order, and integers wrap alike
    inputs = [rng.integers(low, 4, count).astype(dtype) for _ in range(size)]
    return {
        "size": size, "collective": collective, "dtype": dtype, "op": op, "count": count,
        "algorithm": str(rng.choice(["auto", *valid])), "root": int(rng.integers(size)),
        "inputs": inputs, "in_place": collective in IN_PLACE and rng.random() < 0.3,
    }  # fmt: skip


def call(spec: dict[str, Any], comm: C.Communicator) -> Any:
    x = spec["inputs"][comm.rank].copy()
    collective, algorithm, root = spec["collective"], spec["algorithm"], spec["root"]
    options: dict[str, Any] = {"algorithm": algorithm, "comm": comm}
    if spec["in_place"]:
        options["out"] = x
    if collective in ("reduce", "broadcast", "gather", "scatter"):
        options["root"] = root
    if collective in _REDUCING:
        return getattr(C, collective)(x, spec["op"], **options)
    return getattr(C, collective)(x, **options)


def describe(spec: dict[str, Any]) -> str:
    return (
        f"{spec['collective']}({spec['count']} {spec['dtype']}, op={spec['op']}, "
        f"algorithm={spec['algorithm']}, root={spec['root']}, in_place={spec['in_place']})"
    )


def check(spec: dict[str, Any], result: Any, rank: int) -> str | None:
    """What is wrong with ``result`` as this rank's result of ``spec``, or ``None``."""
    expected = _reference(spec)[rank]
    if expected is None:
        return None if result is None else f"expected None, got {result!r}"
    if result is None or result.dtype != expected.dtype or result.tobytes() != expected.tobytes():
        return f"wrong result: {result!r}, expected {expected!r}"
    return None


def fuzz_thread(seed: int, calls: int, comm: C.Communicator, problems: list[str]) -> None:
    rng = np.random.default_rng(seed)
    for number in range(calls):
        spec = draw_call(rng, comm.size)
        try:
            wrong = check(spec, call(spec, comm), comm.rank)
        except C.CollectivesError as error:
            wrong = f"raised {type(error).__name__}: {error}"  # no call of the fuzz is faulty
        except Exception:
            wrong = "raised an error of another kind:\n" + traceback.format_exc()
        if wrong is not None:
            problems.append(f"seed {seed} call {number} {describe(spec)}: {wrong}")
            return  # the ranks' sequences may now differ; the next calls would only repeat it


def interruptions(seed: int, world: MPI.Intracomm, problems: list[str]) -> int:
    """Rounds of a call interrupted on one rank; how many interruptions landed inside a call."""
    rng = np.random.default_rng(seed)
    landed = 0

    def interrupt(signum: int, frame: Any) -> None:
        raise Interrupted

    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        for round_ in range(INTERRUPTIONS):
            victim = int(rng.integers(world.size))
            delay = float(rng.uniform(1e-4, 5e-3))
            algorithm = str(rng.choice(["auto", "ring", "tree", "butterfly"]))
            comm = C.Communicator(world, timeout=30)
            x = np.full(1 << 21, world.rank + 1, np.float32)
            interrupted = False
            try:
                if world.rank == victim:
                    signal.setitimer(signal.ITIMER_REAL, delay)
                C.allreduce(x, algorithm=algorithm, comm=comm)
                signal.setitimer(signal.ITIMER_REAL, 0)
            except Interrupted:
                interrupted = True
            except C.CollectivesError:
                pass  # a peer's interruption may fail this rank's call: the next call must fail too
            except Exception:
                problems.append(f"round {round_}: the interrupted call raised\n{traceback.format_exc()}")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            if world.allreduce(interrupted, MPI.LOR):
                landed += 1
            # the next call on the communicator: right on every rank, or an error on every rank
            expected = np.full(1 << 10, sum(range(1, world.size + 1)), np.float32)
            try:
                after = C.allreduce(np.full(1 << 10, world.rank + 1, np.float32), comm=comm)
                outcome = "ok" if after.tobytes() == expected.tobytes() else "wrong"
            except C.CollectivesError:
                outcome = "error"
            except Exception:
                outcome = "foreign error"
                problems.append(f"round {round_}: the next call raised\n{traceback.format_exc()}")
            outcomes = world.allgather(outcome)
            if "wrong" in outcomes or len(set(outcomes)) > 1:
                problems.append(f"round {round_} (victim {victim}): the next call's outcomes {outcomes}")
            comm.free()
    finally:
        signal.signal(signal.SIGALRM, previous)
    return landed


def main() -> None:
    seed, calls = int(sys.argv[1]), int(sys.argv[2])
    world = MPI.COMM_WORLD
    problems: list[str] = []
    communicators = [C.Communicator(world, timeout=60) for _ in range(THREADS)]
    threads = [
        threading.Thread(target=fuzz_thread, args=(seed + i, calls, comm, problems))
        for i, comm in enumerate(communicators)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for comm in communicators:
        comm.free()
    landed = interruptions(seed + THREADS, world, problems)
    everyone = world.gather([f"rank {world.rank}: {p}" for p in problems], root=0)
    if world.rank == 0:
        found = [p for rank_problems in everyone or [] for p in rank_problems]
        status = "OK" if not found else f"{len(found)} problems"
        print(f"fuzz: {THREADS * calls} calls, {landed} of {INTERRUPTIONS} interrupted mid-call, {status}")
        for problem in found:
            print(problem)
        sys.stdout.flush()
    world.Barrier()
    sys.exit(1 if world.allreduce(len(problems)) else 0)


if __name__ == "__main__":
    main()
