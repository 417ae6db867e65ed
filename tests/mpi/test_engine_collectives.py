"""The compiled engine's small reduce-scatter, all-gather, broadcast, reduce and barrier: the Python
path's bits, each repeat one call from the api into the engine."""

import time
from collections.abc import Callable
from functools import partial
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import engine
from collectives.ops import OPS
from tests.mpi.helpers import DTYPE_OPS, Problems, count_calls
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
    cases: list[Case] = []
    for dtype, op in DTYPE_OPS:
        if not OPS[op].custom:
            # (float16's avg sums in float32; a reduce-scatter into x's own part is no repeat: the full path)
            taken = engine.reduces(dtype, OPS[op].compiled_combine or "") and not in_place
            for rows in ROWS:
                run = partial(_reduce_scattered, dtype=dtype, op=op, rows=rows, in_place=in_place)
                cases.append((f"reduce-scatter {op} {dtype} rows {rows}", taken, run))
    for dtype in ALLGATHER_DTYPES:
        for rows in ROWS:
            run = partial(_gathered, dtype=dtype, rows=rows, in_place=in_place)
            cases.append((f"all-gather {dtype} rows {rows}", True, run))
    _both_paths_alike(world, monkeypatch, cases)


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
    for _ in range(3):  # every key agreed once, so later calls of each take the engine
        collectives.reduce_scatter(x, out=share, comm=comm)
        collectives.allgather(share, out=whole, comm=comm)
        collectives.barrier(comm=comm)
        collectives.broadcast(share, 0, out=share, comm=comm)
        collectives.reduce(share, "sum", size - 1, comm=comm)
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
    for call in range(3):  # (a barrier takes its turn of the window either way, so the next calls agree)
        collectives.barrier(comm=comm)
        x[...] = np.arange(size * 4) - call
        collectives.reduce_scatter(x, out=share, comm=comm)
        problems.expect(np.array_equal(share, size * (np.arange(4) + 4 * rank - call)), "mixed paths: sums")
        collectives.allgather(share, out=whole, comm=comm)
        problems.expect(np.array_equal(whole, size * (np.arange(size * 4) - call)), "mixed paths: gathered")
        mine = share.copy()
        collectives.broadcast(mine, 0, out=mine, comm=comm)
        problems.expect(np.array_equal(mine, size * (np.arange(4) - call)), "mixed paths: broadcast")
        got = collectives.reduce(share, "sum", size - 1, comm=comm)
        if rank == size - 1:
            total = size * np.sum([np.arange(4) + 4 * r - call for r in range(size)], axis=0)
            problems.expect(np.array_equal(got, total), "mixed paths: reduced")
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


@pytest.mark.parametrize("into", ["out", "new"])
def test_a_repeated_call_is_one_call_from_the_api_into_the_engine(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, into: str
) -> None:
    """Past its first calls, a reduce-scatter or an all-gather of rows, into out or a new array, with
    counts or without, runs no Python layer below the api's (a late rank's wait aside)."""
    from collectives import api

    comm = _lean_communicator(world)
    size, rank = world.size, world.rank
    x = np.ones((size * 2, 3), np.float32)
    share = np.empty((2, 3), np.float32) if into == "out" else None
    whole = np.empty((size * 2, 3), np.float32) if into == "out" else None
    counts = [6] * size
    flat = np.empty(6, np.float32) if into == "out" else None
    for _ in range(3):  # the first call decides, the next makes the compiled call
        collectives.reduce_scatter(x, "prod", out=share, comm=comm)
        collectives.allgather(x[:2], out=whole, comm=comm)
        collectives.reduce_scatter(x.reshape(-1), counts=counts, out=flat, comm=comm)
    full = count_calls(monkeypatch, api, "call_collective")
    problems = Problems(world)
    rows = np.arange(size * 6, dtype=np.float32).reshape(size * 2, 3) % 4  # small: exact products

    def mine(r: int, call: int) -> np.ndarray:
        return rows + r + call % 3  # rank r's input

    for call in range(6):
        x[...] = mine(rank, call)
        if call == 3 and rank == size - 1:
            time.sleep(0.05)  # a late rank: the others' wait goes on in Python
        got = collectives.reduce_scatter(x, "prod", out=share, comm=comm)
        problems.expect(got is share if share is not None else got.shape == (2, 3), "the share's array")
        product = np.prod([mine(r, call) for r in range(size)], axis=0, dtype=np.float32)
        problems.expect_equal(f"call {call}: prod", got, product[2 * rank : 2 * rank + 2])
        got = collectives.allgather(x[:2], out=whole, comm=comm)
        problems.expect(
            got is whole if whole is not None else got.shape == (size * 2, 3), "the whole's array"
        )
        expected = np.concatenate([mine(r, call)[:2] for r in range(size)])
        problems.expect_equal(f"call {call}: gathered", got, expected)
        got = collectives.reduce_scatter(x.reshape(-1), counts=counts, out=flat, comm=comm)
        total = np.sum([mine(r, call) for r in range(size)], axis=0, dtype=np.float32).reshape(-1)
        problems.expect_equal(f"call {call}: counts", got, total[6 * rank : 6 * rank + 6])
    problems.expect(full[0] == 0, f"{full[0]} repeated calls took the full path")
    comm.free()
    problems.check()


def test_arrays_and_calls_the_engines_one_call_refuses_take_the_full_path(world: MPI.Intracomm) -> None:
    """Past repeated calls: an output of another shape or dtype, or read-only, raises the full path's
    error; a strided input, an average and an input in the output's own part get the full path's results."""
    comm = _lean_communicator(world)
    size, rank = world.size, world.rank
    x = np.ones(size * 4, np.float32)
    share = np.empty(4, np.float32)
    whole = np.empty(size * 4, np.float32)
    for _ in range(3):
        collectives.reduce_scatter(x, out=share, comm=comm)
        collectives.allgather(share, out=whole, comm=comm)
        collectives.reduce_scatter(x, "avg", out=share, comm=comm)
    read_only = np.empty(4, np.float32)
    read_only.flags.writeable = False
    problems = Problems(world)
    for says, bad in {
        "shape": np.empty(5, np.float32),
        "dtype": np.empty(4, np.float64),
        "read-only": read_only,
    }.items():
        with problems.guard(says), pytest.raises(collectives.InvalidBufferError, match=says):
            collectives.reduce_scatter(x, out=bad, comm=comm)
    wide = np.ones(size * 8, np.float32)
    problems.expect_equal(
        "strided", collectives.reduce_scatter(wide[::2], out=share, comm=comm), np.full(4, size, np.float32)
    )
    x[...] = rank + 1
    problems.expect_equal(
        "avg",
        collectives.reduce_scatter(x, "avg", out=share, comm=comm),
        np.full(4, (size + 1) / 2, np.float32),
    )
    whole[...] = 0
    whole[4 * rank : 4 * rank + 4] = rank  # in place: this rank's share already in its part of out
    collectives.allgather(whole[4 * rank : 4 * rank + 4], out=whole, comm=comm)
    problems.expect_equal("in place", whole, np.repeat(np.arange(size, dtype=np.float32), 4))
    comm.free()
    problems.check()


def _rooted(
    comm: collectives.Communicator, collective: str, dtype: str, op: str | None, root: int, into: str
) -> list[bytes]:
    """The bits of REPEATS broadcasts or reduces (the later ones repeats): in place, into out or new."""
    x = np.zeros(7, _dtype(dtype))
    out = x if into == "in place" else np.zeros_like(x) if into == "out" else None
    results = []
    for call in range(REPEATS):
        x[...] = _inputs(dtype, 7, comm.rank, comm.size, call)
        if collective == "broadcast":
            got = collectives.broadcast(x, root, out=out, comm=comm)
        else:
            got = collectives.reduce(x, op or "sum", root, out=out, comm=comm)
        results.append(b"" if got is None else got.tobytes())
    return results


@pytest.mark.parametrize("into", ["in place", "out", "new"])
def test_the_engines_broadcast_and_reduce_give_the_python_paths_bits(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, into: str
) -> None:
    cases: list[Case] = []
    for root in sorted({0, world.size - 1}):
        for dtype, op in DTYPE_OPS:
            if not OPS[op].custom:
                taken = engine.reduces(dtype, OPS[op].compiled_combine or "")
                run = partial(_rooted, collective="reduce", dtype=dtype, op=op, root=root, into=into)
                cases.append((f"reduce {op} {dtype} root {root}", taken, run))
        for dtype in ALLGATHER_DTYPES:
            run = partial(_rooted, collective="broadcast", dtype=dtype, op=None, root=root, into=into)
            cases.append((f"broadcast {dtype} root {root}", True, run))
    _both_paths_alike(world, monkeypatch, cases)


Case = tuple[str, bool, Callable[[collectives.Communicator], list[bytes]]]
"""What a call gives, whether the engine takes its repeats, and its calls' bits on a communicator."""


def _both_paths_alike(world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch, cases: list[Case]) -> None:
    """Each case's bits with the engine and without; where the case says, the engine ran each repeat (at
    least: a float16 average's float32 twin counts toward the float32 one's)."""
    problems = Problems(world)
    compiled = _lean_communicator(world)
    made = _counting(monkeypatch, compiled.watchdog.shared)
    with monkeypatch.context() as python_only:
        python_only.setattr(engine, "COMPILED", None)
        python = collectives.Communicator(world)
        collectives.barrier(comm=python)
    for what, taken, run in cases:
        before = _runs(made)
        ours = theirs = None
        with problems.guard(f"{what} compiled"):
            ours = run(compiled)
        took = _runs(made) - before
        if taken:
            problems.expect(took >= REPEATS - 1, f"{what}: the engine ran {took} of the repeats")
        with monkeypatch.context() as python_only, problems.guard(f"{what} python"):
            python_only.setattr(engine, "COMPILED", None)
            theirs = run(python)
        if ours is not None and ours != theirs:
            problems.expect(False, f"{what}: the compiled and Python paths differ")
    compiled.free()
    python.free()
    problems.check()


def test_repeated_rooted_calls_and_barriers_are_one_call_each_late_ranks_too(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past their first calls a broadcast, a reduce (its input read-only away from the root) and a barrier
    run no Python layer below the api's, a late rank's wait aside; a rooted mismatch is found everywhere."""
    from collectives import api

    comm = _lean_communicator(world)
    size, rank = world.size, world.rank
    x = np.zeros(5, np.float64)
    for _ in range(3):
        collectives.broadcast(x, 0, out=x, comm=comm)
        collectives.reduce(x, "sum", size - 1, comm=comm)
        collectives.barrier(comm=comm)
    full = count_calls(monkeypatch, api, "call_collective")
    problems = Problems(world)
    for call in range(6):
        late = call % 3 == 2 and rank == call % size  # each rank late once in a while
        x[...] = np.arange(5) + 10 * rank + call
        if late:
            time.sleep(0.05)
        got = collectives.broadcast(x, 0, out=x, comm=comm)
        problems.expect_equal(f"call {call}: broadcast", got, np.arange(5.0) + call)
        x[...] = rank + call
        x.flags.writeable = rank == size - 1
        got = collectives.reduce(x, "sum", size - 1, comm=comm)
        x.flags.writeable = True
        if rank == size - 1:
            problems.expect_equal(
                f"call {call}: reduce", got, np.full(5, size * (size - 1) / 2 + size * call)
            )
        else:
            problems.expect(got is None, f"call {call}: a reduce's result away from its root")
        if late:
            time.sleep(0.05)
        collectives.barrier(comm=comm)
    problems.expect(full[0] == 0, f"{full[0]} repeated calls took the full path")
    with problems.guard("a mismatch"), pytest.raises(collectives.MismatchError):
        collectives.broadcast(x, 0 if rank == 0 else size - 1, out=x, comm=comm)
    comm.free()
    problems.check()
