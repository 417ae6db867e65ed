"""The compiled engine's small reduce-scatter and all-gather: the Python path's bits, in one call each."""

import time
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import engine
from collectives.ops import OPS
from tests.mpi.helpers import DTYPE_OPS, Problems
from tests.mpi.test_engine import _counting, _inputs, _lean_communicator, _runs

pytestmark = [
    pytest.mark.mpi,
    pytest.mark.skipif(not engine.compiled(), reason=f"the compiled engine does not run: {engine.why()}"),
]

REPEATS = 3
ROWS = (1, 5)  # rows a rank: the reduce-scatter's x has size * rows, the all-gather's out too
ALLGATHER_DTYPES = ("float32", "float16", "bfloat16", "int8", "uint16", "int64", "float64")


def _dtype(name: str) -> Any:
    return ml_dtypes.bfloat16 if name == "bfloat16" else name


def _reduce_scattered(
    comm: collectives.Communicator, dtype: str, op: str, rows: int, in_place: bool
) -> list[bytes]:
    """The bits of REPEATS reduce-scatters (the later ones repeats), into ``out`` or x's own part."""
    size, rank = comm.size, comm.rank
    x = np.zeros(size * rows, _dtype(dtype))
    out = x[rank * rows : (rank + 1) * rows] if in_place else np.zeros(rows, x.dtype)
    results = []
    for call in range(REPEATS):
        x[...] = _inputs(dtype, size * rows, rank, size, call)
        got = collectives.reduce_scatter(x, op, out=out, comm=comm)
        results.append(got.tobytes())
    return results


def _gathered(comm: collectives.Communicator, dtype: str, rows: int, in_place: bool) -> list[bytes]:
    """The bits of REPEATS all-gathers, from a separate x or from this rank's own part of out."""
    size, rank = comm.size, comm.rank
    out = np.zeros(size * rows, _dtype(dtype))
    x = out[rank * rows : (rank + 1) * rows] if in_place else np.zeros(rows, out.dtype)
    results = []
    for call in range(REPEATS):
        x[...] = _inputs(dtype, rows, rank, size, call)
        got = collectives.allgather(x, out=out, comm=comm)
        results.append(got.tobytes())
    return results


@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in-place"])
def test_the_engines_reduce_scatter_and_all_gather_give_the_python_paths_bits(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, in_place: bool
) -> None:
    problems = Problems(world)
    compiled = _lean_communicator(world)
    made = _counting(monkeypatch, compiled.watchdog.shared)
    python = None
    with monkeypatch.context() as python_only:
        python_only.setattr(engine, "COMPILED", None)
        python = collectives.Communicator(world)
        collectives.barrier(comm=python)
    cases: list[tuple[str, str | None, int]] = [
        (dtype, op, rows) for dtype, op in DTYPE_OPS if not OPS[op].custom for rows in ROWS
    ]
    cases += [(dtype, None, rows) for dtype in ALLGATHER_DTYPES for rows in ROWS]
    for dtype, op, rows in cases:
        what = f"{'reduce-scatter ' + op if op else 'all-gather'} {dtype} rows {rows}"
        before = _runs(made)
        ours = theirs = None
        with problems.guard(f"{what} compiled"):
            if op is None:
                ours = _gathered(compiled, dtype, rows, in_place)
            else:
                ours = _reduce_scattered(compiled, dtype, op, rows, in_place)
        took = _runs(made) - before
        # (float16's avg sums in float32; a reduce-scatter into x's own part is no repeat: the full path)
        if op is None or (engine.reduces(dtype, OPS[op].compiled_combine or "") and not in_place):
            problems.expect(took == REPEATS - 1, f"{what}: the engine ran {took} of the repeats")
        with monkeypatch.context() as python_only, problems.guard(f"{what} python"):
            python_only.setattr(engine, "COMPILED", None)
            if op is None:
                theirs = _gathered(python, dtype, rows, in_place)
            else:
                theirs = _reduce_scattered(python, dtype, op, rows, in_place)
        if ours is not None and ours != theirs:
            problems.expect(False, f"{what}: the compiled and Python paths differ")
    compiled.free()
    python.free()
    problems.check()


def test_a_late_rank_a_mismatch_and_a_rank_on_the_python_path(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    problems = Problems(world)
    comm = _lean_communicator(world)
    made = _counting(monkeypatch, comm.watchdog.shared)
    size, rank = world.size, world.rank
    x = np.ones(size * 4, np.float32)
    share = np.empty(4, np.float32)
    whole = np.empty(size * 4, np.float32)
    for _ in range(2):  # both keys agreed once, so later calls of either take the engine
        collectives.reduce_scatter(x, out=share, comm=comm)
        collectives.allgather(share, out=whole, comm=comm)
    for call in range(3):  # a late rank: the others wait on past the engine's spin, then finish in it
        x[...] = np.arange(size * 4) + call
        if rank == size - 1:
            time.sleep(0.05)
        collectives.reduce_scatter(x, out=share, comm=comm)
        problems.expect(np.array_equal(share, size * (np.arange(4) + 4 * rank + call)), f"call {call}: sums")
        if rank == 0:
            time.sleep(0.05)
        collectives.allgather(share, out=whole, comm=comm)
        problems.expect(np.array_equal(whole, size * (np.arange(size * 4) + call)), f"call {call}: gathered")
    problems.expect(_runs(made) >= 6, f"the engine ran {_runs(made)} calls")
    if rank == 0:  # rank 0 on the Python path from here on: the paths meet at the same barrier
        for lean in _leans(comm):
            lean._kernel = None
    before = _runs(made)
    for call in range(2):
        x[...] = np.arange(size * 4) - call
        collectives.reduce_scatter(x, out=share, comm=comm)
        problems.expect(np.array_equal(share, size * (np.arange(4) + 4 * rank - call)), "mixed paths: sums")
        collectives.allgather(share, out=whole, comm=comm)
        problems.expect(np.array_equal(whole, size * (np.arange(size * 4) - call)), "mixed paths: gathered")
    problems.expect((_runs(made) > before) == (rank != 0), f"rank {rank} ran {_runs(made) - before} calls")
    with problems.guard("a mismatch"), pytest.raises(collectives.MismatchError):
        if rank == 0:  # the ranks' calls differ: found in the engine's compare (and Python's)
            collectives.reduce_scatter(x, out=share, comm=comm)
        else:
            collectives.allgather(share, out=whole, comm=comm)
    comm.free()
    problems.check()


def _leans(comm: collectives.Communicator) -> list[Any]:
    return [repeat.lean for repeat in comm.repeats.values() if getattr(repeat, "lean", None) is not None]
