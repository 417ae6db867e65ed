"""Under mpiexec: an interrupt anywhere inside a call never leaves a rank a call behind or ahead.

Rank 1 is interrupted (a ``KeyboardInterrupt`` raised by a trace hook) as its call enters
one of the library's functions, each function of the repeated and of the cold path in
turn, and then keeps calling with the next data, as a loop that catches the interrupt
would. The call either left no trace anywhere or broke the communicator on every rank:
no rank ever gets a wrong result, and every rank ends with an error naming the interrupt.
"""

import sys
from collections.abc import Callable
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import BrokenCommunicatorError, engine
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

PACKAGE = str(Path(collectives.__file__).parent)
VICTIM = 1
INTERRUPTED_CALL = 3
CALLS = 8
COUNT = 64


def _call(collective: str, comm: collectives.Communicator, i: int, cold: bool) -> tuple[Any, Any]:
    """Call ``i`` of ``collective``: its result and the result every rank must get."""
    size, rank = comm.size, comm.rank
    count = COUNT + i if cold else COUNT  # a new shape every call keeps it off the repeated path
    if collective == "allreduce":
        x = np.full(count, rank + 1 + i, np.float32)
        return collectives.allreduce(x, comm=comm), np.full(count, size * (size + 1) / 2 + size * i)
    if collective == "allgather":
        x = np.full(count, rank + i, np.float32)
        expected = np.repeat(np.arange(size, dtype=np.float32) + i, count).reshape(size, count)
        return collectives.allgather(x, comm=comm), expected
    if collective == "reduce_scatter":
        x = np.full(size * count, rank + 1 + i, np.float32)
        return collectives.reduce_scatter(x, comm=comm), np.full(count, size * (size + 1) / 2 + size * i)
    if collective == "reduce":  # the result at the root, rank 0; None elsewhere
        x = np.full(count, rank + 1 + i, np.float32)
        total = np.full(count, size * (size + 1) / 2 + size * i)
        reduced = collectives.reduce(x, root=0, comm=comm)
        return (total if rank != 0 and reduced is None else reduced), total
    if collective == "barrier":  # nothing to get: only that it returns, in step with the others
        return collectives.barrier(comm=comm), None
    x = np.full(count, i if rank == 0 else -1, np.float32)
    return collectives.broadcast(x, root=0, comm=comm), np.full(count, i)


def _entered(public: str, run: Callable[[], object]) -> list[CodeType]:
    """The library's functions ``run``'s call of ``public`` enters, in the order first entered.

    The public function's own entry is left out: it is before its first line, so an
    interrupt there is the caller's, as one just before the call.
    """
    seen: dict[CodeType, None] = {}
    inside = False

    def profile(frame: FrameType, event: str, arg: object) -> None:
        nonlocal inside
        code = frame.f_code
        if event != "call" or not code.co_filename.startswith(PACKAGE):
            return
        if inside:
            seen.setdefault(code, None)
        elif code.co_name == public and code.co_filename.endswith("api.py"):
            inside = True

    sys.setprofile(profile)
    try:
        run()
    finally:
        sys.setprofile(None)
    return list(seen)


def _interrupt_on_entering(public: str, code: CodeType) -> None:
    """Raise KeyboardInterrupt as this thread next enters ``code`` inside a call of ``public``, once."""
    inside = False

    def trace(frame: FrameType, event: str, arg: object) -> None:
        nonlocal inside
        if event != "call":
            return None
        if inside and frame.f_code is code:
            sys.settrace(None)
            raise KeyboardInterrupt
        if frame.f_code.co_name == public and frame.f_code.co_filename.endswith("api.py"):
            inside = True
        return None

    sys.settrace(trace)


PATHS = [(collective, cold, False) for collective in ("allreduce", "allgather", "reduce_scatter", "broadcast")
         for cold in (False, True)] + [("reduce", False, False), ("barrier", False, False)] + [
             (collective, False, True) for collective in ("allreduce", "allgather", "reduce_scatter",
                                                          "broadcast", "reduce", "barrier")]  # fmt: skip
ONE_CALL = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "barrier")
"""The collectives whose repeated call is one call from the api into the compiled engine."""


@pytest.mark.parametrize(
    ("collective", "cold", "python_path"),
    PATHS,
    ids=[f"{c}-{'cold' if k else 'repeated'}{'-python' if p else ''}" for c, k, p in PATHS],
)
def test_an_interrupt_entering_any_function_of_a_call_never_shifts_the_ranks(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, collective: str, cold: bool, python_path: bool
) -> None:
    """A repeated call runs as one call into the compiled engine where it runs (entering only the Python
    it calls back), and as its Python path's functions with the engine off (``-python``)."""
    if world.size not in (2, 3):  # each function of the path in turn: long past 3 ranks on 2 cores
        pytest.skip("2 and 3 ranks show it")
    if python_path:
        monkeypatch.setattr(engine, "COMPILED", None)
    one_call = collective in ONE_CALL and not cold and engine.COMPILED is not None
    problems = Problems(world)
    # the functions rank 1's call enters on this path, after two calls of the same shape
    comm = collectives.Communicator(world, timeout=20.0)
    for i in range(INTERRUPTED_CALL):
        _call(collective, comm, i, cold)
    names: list[str] = []
    codes: list[CodeType] = []
    if world.rank == VICTIM:
        codes = _entered(collective, lambda: _call(collective, comm, INTERRUPTED_CALL, cold))
        names = [f"{Path(c.co_filename).name}:{c.co_name}" for c in codes]
    else:
        _call(collective, comm, INTERRUPTED_CALL, cold)
    comm.free()
    names = world.bcast(names, root=VICTIM)
    problems.expect(len(names) > (0 if one_call else 3), f"{collective}: the call entered only {names}")
    for at, name in enumerate(names):
        comm = collectives.Communicator(world, timeout=20.0)
        interrupted, broken = False, []
        for i in range(CALLS):
            if world.rank == VICTIM and i == INTERRUPTED_CALL:
                _interrupt_on_entering(collective, codes[at])
            try:
                result, expected = _call(collective, comm, i, cold)
                problems.expect(
                    bool(np.array_equal(np.ravel(result), np.ravel(expected))),
                    f"{name}: call {i} gave {np.ravel(result)[:3]}, not {np.ravel(expected)[:3]}",
                )
            except KeyboardInterrupt:  # the user catches it and goes on with the next data
                interrupted = True
            except BrokenCommunicatorError as error:
                broken.append(str(error))
            except collectives.CollectivesError as error:  # recorded, so every rank goes on alike
                problems.expect(False, f"{name}: call {i} raised {type(error).__name__}: {error}")
            finally:
                sys.settrace(None)
        if world.bcast(interrupted, root=VICTIM):  # (a function entered only where a wait is long may not be)
            # every rank learns of it, by the interrupt's name, and no later call runs
            problems.expect(
                len(broken) >= CALLS - INTERRUPTED_CALL - 1 and all("KeyboardInterrupt" in b for b in broken),
                f"{name}: rank {world.rank} saw {broken[:1]} ({len(broken)} broken calls)",
            )
        else:
            problems.expect(not broken, f"{name}: not interrupted, yet {broken[:1]}")
        comm.free()
    problems.check()
