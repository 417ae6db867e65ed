"""Repeated plain allreduces on the lean path under mpiexec: results, agreement, bad input, timeouts."""

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import DTYPE_OPS, Problems, assert_all, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

REPEATS = 4


def _lean(comm: collectives.Communicator) -> bool:
    """Whether this communicator's ranks share memory, where repeated small allreduces run lean."""
    return comm.size > 1 and comm.shared is not None and comm.watchdog.shared is not None


def _recorded(comm: collectives.Communicator) -> int:
    """How many calls the flight recorder counts: a line each, or the lean repeats' count in a row's entry.

    A lean repeat that waited past 1 ms (a busy machine) has a line of its own.
    """
    lines = comm.watchdog.flight_record()
    return sum(
        int(line.split("repeated calls=")[1].split()[0]) if "repeated calls=" in line else 1 for line in lines
    )


def test_repeated_plain_calls_run_lean_and_stay_correct(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    for dtype, op, place in [
        ("float32", "sum", "in place"),
        ("float64", "avg", "out"),
        ("int32", "max", "new"),
    ]:
        x = np.zeros(5, dtype)
        out = x if place == "in place" else np.empty_like(x) if place == "out" else None
        for call in range(REPEATS):
            x[...] = np.arange(5) * (world.rank + 1) + call
            expected = mpi_reference("allreduce", x, op, world)
            got = collectives.allreduce(x, op, out=out, comm=comm)
            problems.expect_equal(f"{dtype} {op} {place} call {call}", got, expected)
            if out is not None:
                problems.expect(got is out, f"{dtype} {op} {place}: the result is not out")
    problems.expect(_recorded(comm) == 3 * REPEATS, comm.watchdog.flight_record_text())
    if _lean(
        comm
    ):  # every key's first call (or second: the first "auto" one agrees on the selector) kept its lean path
        kept = list(comm.repeats.values())
        problems.expect(
            len(kept) == 3 and all(p.lean is not None for p in kept), f"{len(kept)} kept, not lean"
        )
    comm.free()
    problems.check()


def test_lean_repeats_that_differ_raise_on_every_rank(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("ranks can differ only where there are several")
    comm = collectives.Communicator(world, timeout=60)
    problems = Problems(world)
    r = world.rank
    x, y = np.ones(4, np.float32), np.ones(4, np.float64)
    for _ in range(2):  # every key's decisions kept: the calls below are repeats, lean where memory is shared
        for a, op in [(x, "sum"), (x, "max"), (y, "sum")]:
            collectives.allreduce(a, op, out=a, comm=comm)
            a[:] = 1
    lean = _lean(comm)
    with problems.guard("op"), pytest.raises(collectives.MismatchError, match="op"):
        collectives.allreduce(x, "max" if r == 0 else "sum", out=x, comm=comm)
    with problems.guard("dtype"), pytest.raises(collectives.MismatchError, match="dtype"):
        a = y if r == 0 else x
        collectives.allreduce(a, out=a, comm=comm)
    # a bad argument on one rank: it raises its error, the others hear of it at once
    with problems.guard("bad op"):
        error = collectives.UnsupportedOpError if r == 0 else collectives.PeerInputError
        with pytest.raises(error):
            collectives.allreduce(x, "bor" if r == 0 else "sum", out=x, comm=comm)
    # what a layer above says the calls are of (the key-value store's key) travels with a lean repeat
    # too, and with a persistent start
    persistent = collectives.allreduce_init(y, out=y, comm=comm)
    comm.watchdog.tag = b"key%d" % r
    with problems.guard("tag"), pytest.raises(collectives.MismatchError, match="tag"):
        collectives.allreduce(x, out=x, comm=comm)
    with problems.guard("tag of a start"), pytest.raises(collectives.MismatchError, match="tag"):
        persistent()
    comm.watchdog.tag = b""
    x[:] = 1
    problems.expect_equal(
        "after", collectives.allreduce(x, out=x, comm=comm), np.full(4, world.size, np.float32)
    )
    if lean:
        problems.expect(all(p.lean is not None for p in comm.repeats.values()), "a repeat is not lean")
    comm.free()
    problems.check()


def test_a_rank_that_skips_a_repeated_call_times_the_others_out(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("a peer can be missing only where there are several")
    comm = collectives.Communicator(world, timeout=1.0)
    x = np.ones(4)
    for _ in range(3):
        collectives.allreduce(x, out=x, comm=comm)
    timed_out = False
    if world.rank != 0:
        try:
            collectives.allreduce(x, out=x, comm=comm)
        except collectives.CollectiveTimeout:
            timed_out = True
    world.Barrier()
    comm.free()
    assert_all(timed_out or world.rank == 0, "a repeated call with a missing peer did not time out")


def test_a_lean_repeat_against_a_plain_call_is_checked_whole(world: MPI.Intracomm) -> None:
    # a lean repeat posts its signature's sequence number and digest only where its last post is
    # there still; a plain call's post leaves no digest, so the signatures are compared whole
    if world.size == 1:
        pytest.skip("ranks can differ only where there are several")
    comm = collectives.Communicator(world, timeout=60)
    problems = Problems(world)
    r = world.rank
    x = np.ones(4, np.float32)
    for _ in range(3):
        collectives.allreduce(x, out=x, comm=comm)
        x[:] = 1
    comm.watchdog.debug = r == 1  # rank 1 takes the plain path: the same call, posted whole
    for _ in range(3):
        problems.expect_equal(
            "lean against plain",
            collectives.allreduce(x, out=x, comm=comm),
            np.full(4, world.size, np.float32),
        )
        x[:] = 1
    comm.watchdog.debug = False
    with (
        problems.guard("a new call against a repeat"),
        pytest.raises(collectives.MismatchError, match="count"),
    ):
        collectives.allreduce(np.ones(5 if r == 1 else 4, np.float32), out=x if r != 1 else None, comm=comm)
    x[:] = 1
    problems.expect_equal(
        "after", collectives.allreduce(x, out=x, comm=comm), np.full(4, world.size, np.float32)
    )
    comm.free()
    problems.check()


def test_lean_repeats_of_every_dtype_and_op_give_mpis_results_with_a_late_rank(world: MPI.Intracomm) -> None:
    # a small repeat posts, arrives, waits and compares in one call; a rank late past the spin
    # (1 ms) sends the others on to wait as a Call of their own, whose record then stands alone
    comm = collectives.Communicator(world, timeout=60)
    problems = Problems(world)
    for dtype, op in DTYPE_OPS:
        for count in (1, 7, 301):
            x = exact_input(op, dtype, count, world.rank, world.size)
            expected = mpi_reference("allreduce", x, op, world)
            for call in range(3):
                if call == 2 and world.rank == world.size - 1:
                    time.sleep(0.005)
                out = np.empty_like(x)
                with problems.guard(f"{dtype} {op} {count} call {call}"):
                    got = collectives.allreduce(x, op, out=out, comm=comm)
                    problems.expect_equal(f"{dtype} {op} count {count} call {call}", got, expected)
    if _lean(comm):
        problems.expect(all(p.lean is not None for p in comm.repeats.values()), "a repeat is not lean")
        lines = comm.watchdog.flight_record()
        alone = [i for i in range(1, len(lines)) if "repeated calls=" in lines[i - 1] and "time=" in lines[i]]
        problems.expect(world.rank == world.size - 1 or alone, "no late repeat was recorded alone")
    comm.free()
    problems.check()
