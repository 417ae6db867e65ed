"""Under mpiexec: an interrupt anywhere inside a store's call never leaves a worker a round or clock apart.

As tests/mpi/test_interrupts.py does for the collectives: worker 1 is interrupted (a
``KeyboardInterrupt`` raised by a trace hook) as its step's calls enter one of the
library's functions, each function the step enters in turn, and then keeps stepping
with the next data, as a loop that catches the interrupt would. The step either left
no trace or broke the store on every rank: no worker ever gets a wrong value, every
worker ends with an error naming the interrupt, and every worker's close returns.
"""

import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.kvstore import KVStore, create
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

PACKAGE = str(Path(collectives.__file__).parent)
VICTIM = 1
INTERRUPTED_STEP = 3
STEPS = 7
COUNT = 64  # float32: 256 bytes, four partitions of 64 bytes over the servers
TIMEOUT_S = 4.0  # a store left a round apart shows as a timeout: keep it short


def _step(case: str, kv: KVStore, i: int) -> tuple[np.ndarray, float]:
    """Step ``i`` of ``case``'s loop: what the worker pulled, and the value each element must have."""
    workers, rank = _workers(case), MPI.COMM_WORLD.rank  # (the store's properties run its code)
    x = np.full(COUNT, rank + 1 + i, np.float32)
    round_sum = workers * (workers + 1) / 2 + workers * i  # every worker's push of step i, summed
    if case == "sync-collective-pushpull":  # the repeated pushpull: one allreduce by its plan
        return kv.pushpull("w", x, out=np.empty(COUNT, np.float32)), round_sum
    if case in ("sync-collective", "sync-messages", "sync-dedicated"):
        kv.push("w", x)
        return kv.pull("w"), round_sum
    # async and ssp accumulate; the barriers make the value exact (every push of the step, none later)
    kv.push("w", x)
    if case == "ssp":
        kv.clock()
    kv.barrier()
    got = kv.pull("w")
    kv.barrier()
    return got, sum(workers * (workers + 1) / 2 + workers * j for j in range(i + 1))


CASES = {
    "sync-collective-pushpull": ("sync", True),
    "sync-collective": ("sync", True),
    "sync-messages": ("sync", False),
    "async": ("async", False),
    "ssp": ("ssp", False),
    "sync-dedicated": ("sync", False),  # the last rank a server only
}


def _workers(case: str) -> int:
    return MPI.COMM_WORLD.size - (case == "sync-dedicated")


def _store(world: MPI.Intracomm, case: str) -> KVStore:
    mode, collective = CASES[case]
    servers = 1 if case == "sync-dedicated" else None
    kv = create(
        mode, comm=world, servers=servers, partition_bytes=64, timeout=TIMEOUT_S, collective=collective
    )
    if kv.role == "worker":
        kv.init("w", np.zeros(COUNT, np.float32))
    return kv


def _nested(frame: FrameType) -> bool:
    """Whether ``frame`` is a library function called by the library: inside a store's call."""
    caller = frame.f_back
    return frame.f_code.co_filename.startswith(PACKAGE) and (
        caller is not None and caller.f_code.co_filename.startswith(PACKAGE)
    )


def _entered(run: Callable[[], object]) -> list[CodeType]:
    """The library's functions ``run``'s calls on the store enter, in the order first entered.

    A call's own entry (from the test's frame) is left out: an interrupt there is
    before its first line, as one just before the call.
    """
    seen: dict[CodeType, None] = {}

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and _nested(frame):
            seen.setdefault(frame.f_code, None)

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return list(seen)


def _interrupt_on_entering(code: CodeType) -> None:
    """Raise KeyboardInterrupt as this thread next enters ``code`` inside a call on the store, once."""

    def trace(frame: FrameType, event: str, arg: object) -> None:
        if event == "call" and frame.f_code is code and _nested(frame):
            sys.settrace(None)
            raise KeyboardInterrupt

    sys.settrace(trace)


@pytest.mark.parametrize("case", list(CASES))
def test_an_interrupt_entering_any_function_of_a_stores_call_never_shifts_the_workers(
    world: MPI.Intracomm, case: str
) -> None:
    if _workers(case) < 2:
        pytest.skip("needs a worker beside the one interrupted")
    if world.size > 3:  # each function of the step in turn: long past 3 ranks on 2 cores
        pytest.skip("2 and 3 ranks show it")
    problems = Problems(world)
    # the functions worker 1's step enters, after steps of the same shape
    kv = _store(world, case)
    for i in range(INTERRUPTED_STEP if kv.role == "worker" else 0):
        _step(case, kv, i)
    codes: list[CodeType] = []
    if world.rank == VICTIM:
        codes = _entered(lambda: _step(case, kv, INTERRUPTED_STEP))
    elif kv.role == "worker":
        _step(case, kv, INTERRUPTED_STEP)
    kv.close()
    names = world.bcast([f"{Path(c.co_filename).name}:{c.co_name}" for c in codes], root=VICTIM)
    problems.expect(len(names) > 5, f"{case}: the step entered only {names}")
    for at, name in enumerate(names):
        kv = _store(world, case)
        interrupted, failed, errors = False, False, []
        for i in range(STEPS if kv.role == "worker" else 0):
            if world.rank == VICTIM and i == INTERRUPTED_STEP:
                _interrupt_on_entering(codes[at])
            try:
                got, expected = _step(case, kv, i)
                if not np.array_equal(got, np.full(COUNT, expected, np.float32)):
                    problems.expect(
                        False,
                        f"{name}: step {i} gave {got[got != expected][:3]} "
                        f"at {np.flatnonzero(got != expected)[:4]}, not {expected}",
                    )
                    failed = True
            except KeyboardInterrupt:  # the user catches it and goes on with the next data
                interrupted = True
            except collectives.CollectivesError as error:  # recorded, so every rank goes on alike
                errors.append(f"step {i}: {type(error).__name__}: {error}")
            finally:
                sys.settrace(None)
        try:
            kv.close()
        except collectives.CollectivesError as error:
            problems.expect(False, f"{name}: close raised {type(error).__name__}: {error}")
            failed = True
        if world.bcast(interrupted, root=VICTIM):
            # every rank learns of it, by the interrupt's name, and no later step completes
            named = [e for e in errors if "KeyboardInterrupt" in e]
            fewer = len(named) < STEPS - INTERRUPTED_STEP - 1 and kv.role == "worker"
            if fewer or len(named) != len(errors):
                problems.expect(False, f"{name}: rank {world.rank} saw {errors[:2]} ({len(errors)} errors)")
                failed = True
        elif errors:  # (a function entered only where a wait is long may not be)
            problems.expect(False, f"{name}: not interrupted, yet {errors[:1]}")
            failed = True
        if world.allreduce(failed, op=MPI.LOR):  # one failing function says it: the rest would take long
            break
    problems.check()
