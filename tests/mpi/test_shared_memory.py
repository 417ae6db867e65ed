"""The shared-memory executor under mpiexec: allreduce, reduce_scatter and allgather against mpi4py."""

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import engine
from collectives.transport.mpi import shared_memory
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

# past one segment of the window's halves, and past the one-barrier path of small allreduces
# (70_001 passes one barrier at 2 ranks where the compiled engine runs, and goes in segments on the
# Python path and at more ranks; 300_007 and 1_100_003 go in segments everywhere)
COUNTS = [0, 1, 5, 4097, 70_001, 300_007, 1_100_003]


def test_shared_memory_runs_through_the_window(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    problems.expect("shared_memory" in comm.features, f"features {set(comm.features)}")
    problems.expect(comm.shared is not None, "no shared executor")
    compiled = engine.COMPILED is not None
    problems.expect(("compiled" in comm.features) == compiled, f"features {set(comm.features)}")
    comm.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_shared_memory_matches_mpi(world: MPI.Intracomm, dtype: str) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    for count in COUNTS:
        x = exact_input("sum", dtype, count, r, p)
        with problems.guard(f"allreduce count={count}"):
            expected = mpi_reference("allreduce", x, "sum", world)
            problems.expect_equal(
                f"allreduce {count}", collectives.allreduce(x, algorithm="shared_memory", comm=comm), expected
            )
            y = x.copy()
            collectives.allreduce(y, out=y, algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"allreduce in place {count}", y, expected)
        rows = count // p * p
        with problems.guard(f"reduce_scatter count={rows}"):
            expected = mpi_reference("reduce_scatter", x[:rows], "sum", world)
            got = collectives.reduce_scatter(x[:rows], algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"reduce_scatter {rows}", got, expected)
        with problems.guard(f"allgather count={count}"):
            got = collectives.allgather(x, algorithm="shared_memory", comm=comm)
            problems.expect_equal(f"allgather {count}", got, np.concatenate(world.allgather(x)))
    comm.free()
    problems.check()


def test_the_fenced_barrier_of_other_processors_gives_mpis_results(
    world: MPI.Intracomm, monkeypatch: pytest.MonkeyPatch
) -> None:
    # x86 needs no Win.Sync fences in the barrier; Arm and POWER take this path
    monkeypatch.setattr(shared_memory, "ORDERED_STORES", False)
    comm = collectives.Communicator(world)
    problems = Problems(world)
    problems.expect(getattr(comm.transport.shared_memory(), "_fence", False), "the barrier is not fenced")
    for count in (1, 4097, 1_100_003):
        x = exact_input("sum", "float32", count, world.rank, world.size)
        expected = mpi_reference("allreduce", x, "sum", world)
        for _ in range(3):  # the repeats take the lean path
            with problems.guard(f"allreduce count={count}"):
                problems.expect_equal(f"allreduce {count}", collectives.allreduce(x, comm=comm), expected)
    comm.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_alloc_buffers_reduce_where_they_lie(world: MPI.Intracomm, dtype: str) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    problems.expect("shared_memory" in comm.features, "no shared memory")
    shared = comm.shared
    for count in COUNTS:
        for op in ("sum", "max"):
            x = exact_input(op, dtype, count, r, p)
            expected = mpi_reference("allreduce", x, op, world)
            with problems.guard(f"allreduce alloc {op} count={count}"):
                y = comm.alloc(count, dtype)
                problems.expect(isinstance(y, np.ndarray) and y.shape == (count,), f"alloc gave {y!r}")
                problems.expect(shared is None or shared._locate(y) is not None, "alloc not in shared memory")
                y[:] = x
                got = collectives.allreduce(y, op, out=y, algorithm="shared_memory", comm=comm)
                problems.expect(got is y, "in place did not return out")
                problems.expect_equal(f"allreduce alloc in place {op} {count}", y, expected)
                # out of place, both from alloc: the input stays as it was
                z = comm.alloc((count,), np.dtype(dtype))
                y[:] = x
                collectives.allreduce(y, op, out=z, algorithm="shared_memory", comm=comm)
                problems.expect_equal(f"allreduce alloc out of place {op} {count}", z, expected)
                problems.expect_equal(f"allreduce alloc input kept {op} {count}", y, x)
        rows = count // p * p
        x = exact_input("sum", dtype, rows, r, p)
        with problems.guard(f"reduce_scatter alloc count={rows}"):
            y = comm.alloc(rows, dtype)
            y[:] = x
            got = collectives.reduce_scatter(y, algorithm="shared_memory", comm=comm)
            problems.expect_equal(
                f"reduce_scatter alloc {rows}", got, mpi_reference("reduce_scatter", x, "sum", world)
            )
            problems.expect_equal(f"reduce_scatter alloc input kept {rows}", y, x)
    comm.free()
    problems.check()


def test_alloc_on_some_ranks_only_is_a_mismatch_everywhere(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    from collectives.shared_sizes import small_bytes

    comm = collectives.Communicator(world, check=False)
    problems = Problems(world)
    count = small_bytes(world.size, compiled=True) // 4 + 50_007  # past the one-barrier path
    y = comm.alloc(count, "float32")  # collective: every rank allocates
    x = y if world.rank == 0 else np.empty(count, np.float32)
    x[:] = 1
    try:
        collectives.allreduce(x, out=x, algorithm="shared_memory", comm=comm)
        problems.expect(False, "no MismatchError")
    except collectives.MismatchError as error:
        problems.expect("Communicator.alloc" in str(error), f"message: {error}")
    # the communicator still works afterwards, both ways
    for buffer in (y, np.empty(count, np.float32)):
        buffer[:] = 1
        collectives.allreduce(buffer, out=buffer, algorithm="shared_memory", comm=comm)
        problems.expect(bool((buffer == world.size).all()), "wrong sum after the mismatch")
    comm.free()
    problems.check()


def test_explain_told_the_node_layout_names_what_a_call_runs(world: MPI.Intracomm) -> None:
    import os
    import re

    if world.size > (os.cpu_count() or 1):
        pytest.skip("the ranks outnumber the cores: the communicator weighs that, an assumed layout does not")
    comm = collectives.Communicator(world)
    if "shared_memory" not in comm.features:
        comm.free()
        pytest.skip("the ranks share no memory here")
    problems = Problems(world)
    for count in (8, 65_536, 1 << 20):
        x = np.ones(count, np.float32)
        with problems.guard(f"count={count}"):
            collectives.allreduce(x, comm=comm)
            ran = re.search(r"algorithm=(\S+)", comm.flight_record()[-1])
            # no communicator: the layout is told, not found
            told = collectives.explain("allreduce", count, world_size=world.size, ranks_per_node=world.size)
            problems.expect(
                ran is not None and ran.group(1) == told.choice, f"{count}: ran {ran}, explain {told.choice}"
            )
    comm.free()
    problems.check()
