"""Persistent collectives (allreduce_init ...) under mpiexec, against mpi4py's own collectives."""

from collections.abc import Iterator

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from tests.mpi.helpers import DTYPE_OPS, Problems, assert_all, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

COUNTS = [1, 7, 3001, 70_001]  # odd; the one-barrier shared-memory path, then its segmented one
STARTS = 3


@pytest.fixture(scope="module")
def shared() -> Iterator[collectives.Communicator]:
    """One communicator for the many small cases: making one (its shared memory) costs more than they do."""
    comm = collectives.Communicator(MPI.COMM_WORLD)
    yield comm
    comm.free()


@pytest.mark.parametrize(("dtype", "op"), DTYPE_OPS)
def test_allreduce_init_every_dtype_and_op(
    world: MPI.Intracomm, shared: collectives.Communicator, dtype: str, op: str
) -> None:
    comm = shared
    problems = Problems(world)
    p, r = world.size, world.rank
    for count, place in [(1, "new"), (7, "in place"), (7, "out"), (3001, "in place")]:
        label = f"{dtype} {op} count={count} {place}"
        with problems.guard(label):
            x = exact_input(op, dtype, count, r, p)
            out = x if place == "in place" else np.empty_like(x) if place == "out" else None
            persistent = collectives.allreduce_init(x, op, out=out, comm=comm)
            for start in range(STARTS):
                # the contents at each start are what it reduces
                x[...] = exact_input(op, dtype, count, r + start, p)
                expected = mpi_reference("allreduce", x, op, world)
                if start % 2:
                    persistent.start()
                    got = persistent.wait()
                else:
                    got = persistent()
                problems.expect_equal(f"{label} start {start}", got, expected)
                if out is not None:
                    problems.expect(got is out, f"{label}: the result is not out")
    problems.check()


def test_allreduce_init_large_and_shaped(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    x = np.arange(COUNTS[-1] * 2, dtype=np.float64).reshape(2, -1) * (world.rank + 1)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    for start in range(STARTS):
        x[...] = np.arange(x.size, dtype=np.float64).reshape(x.shape) * (world.rank + start + 1)
        expected = mpi_reference("allreduce", x, "sum", world)
        problems.expect_equal(f"start {start}", persistent(), expected)
    comm.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "int64", "float16"])
def test_reduce_scatter_allgather_broadcast_init(world: MPI.Intracomm, dtype: str) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    p, r = world.size, world.rank
    x = np.zeros(3 * p, dtype)
    shares = collectives.reduce_scatter_init(x, comm=comm)
    mine = np.zeros(5, dtype)
    gathered = collectives.allgather_init(mine, comm=comm)
    sent = np.zeros(7, dtype)
    root = p - 1
    copied = collectives.broadcast_init(sent, root, comm=comm)
    for start in range(STARTS):
        x[:] = (np.arange(3 * p) + r + start) % 7
        mine[:] = np.arange(5) + r * 10 + start
        sent[:] = np.arange(7) + r + start
        problems.expect_equal(
            f"reduce_scatter {start}", shares(), mpi_reference("reduce_scatter", x, "sum", world)
        )
        expected = np.concatenate(world.allgather(mine.copy()))
        problems.expect_equal(f"allgather {start}", gathered(), expected)
        copied.start()
        problems.expect_equal(f"broadcast {start}", copied.wait(), world.bcast(sent.copy(), root))
    comm.free()
    problems.check()


def test_bad_use_is_named(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    x = np.ones(6, np.float32)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    with (
        problems.guard("wait without start"),
        pytest.raises(collectives.PersistentStateError, match="not started"),
    ):
        persistent.wait()
    persistent.start()
    with problems.guard("start twice"):
        with pytest.raises(collectives.PersistentStateError, match="started twice"):
            persistent.start()
        with pytest.raises(collectives.PersistentStateError, match="not waited for"):
            persistent()
    problems.expect_equal("after bad use", persistent.wait(), np.full(6, world.size, np.float32))
    with problems.guard("reshaped"):
        x.shape = (2, 3)
        with pytest.raises(collectives.InvalidBufferError, match=r"shape \(6,\).*now of shape \(2, 3\)"):
            persistent()
        x.shape = (6,)
        x.dtype = np.int32  # same bytes, another type
        with pytest.raises(collectives.InvalidBufferError, match=r"dtype float32 .* dtype int32"):
            persistent.start()
        x.dtype = np.float32
    x[:] = 1
    problems.expect_equal("after a refused start", persistent(), np.full(6, world.size, np.float32))
    comm.free()
    with problems.guard("freed"):
        with pytest.raises(collectives.FreedCommunicatorError):
            persistent()
        with pytest.raises(collectives.FreedCommunicatorError):
            persistent.start()
        with pytest.raises(collectives.FreedCommunicatorError):
            collectives.allreduce_init(x, comm=comm)
    problems.check()


def test_inits_and_starts_that_differ_raise_on_every_rank(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("ranks can differ only where there are several")
    comm = collectives.Communicator(world, timeout=60)
    problems = Problems(world)
    r = world.rank
    count = 5 if r == 0 else 6
    with problems.guard("init"), pytest.raises(collectives.MismatchError, match="count"):
        collectives.allreduce_init(np.ones(count), comm=comm)
    # an init never pairs with a plain call
    with problems.guard("init against a plain call"), pytest.raises(collectives.MismatchError, match="_init"):
        if r == 0:
            collectives.allreduce_init(np.ones(4), comm=comm)
        else:
            collectives.allreduce(np.ones(4), comm=comm)
    # a bad argument on one rank: it raises its error, the others hear of it at once
    with problems.guard("bad op"):
        error = collectives.UnsupportedOpError if r == 0 else collectives.PeerInputError
        with pytest.raises(error):
            collectives.allreduce_init(np.ones(4), "bor" if r == 0 else "sum", comm=comm)
    x = np.ones(4)
    small = collectives.allreduce_init(x, out=x, comm=comm)
    y = np.ones(9)
    other = collectives.allreduce_init(y, out=y, comm=comm)
    problems.expect(small.lean and other.lean, "a small sum on one node's shared memory is not lean")
    problems.expect_equal("first start", small(), np.full(4, world.size, np.float64))
    # a start that meets another call on another rank raises there and here, and nothing is kept
    with problems.guard("a start against another call"), pytest.raises(collectives.MismatchError):
        if r == 0:
            other()
        else:
            small()
    x[:] = 1
    problems.expect_equal("after the mismatch", small(), np.full(4, world.size, np.float64))
    comm.free()
    problems.check()


def test_a_rank_that_never_starts_times_the_others_out(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("a peer can be missing only where there are several")
    comm = collectives.Communicator(world, timeout=1.0)
    x = np.ones(4)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    persistent()
    timed_out = False
    if world.rank != 0:
        try:
            persistent()
        except collectives.CollectiveTimeout:
            timed_out = True
    world.Barrier()
    comm.free()
    assert_all(timed_out or world.rank == 0, "a start with a missing peer did not time out")


def test_rebind_moves_the_starts_to_other_buffers(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    x = np.ones(5, np.float32)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    lean = persistent.lean
    # each rank its own buffer, wherever it lies: local, nothing is agreed
    y = np.full(5, world.rank + 1, np.float32)
    expected = mpi_reference("allreduce", y, "sum", world)
    persistent.rebind(y)
    problems.expect_equal("rebound", persistent(), expected)
    problems.expect(bool((x == 1).all()), "the init's buffer was written after the rebind")
    problems.expect(persistent.lean == lean, "the rebind changed the start's path")
    with problems.guard("wrong shape"), pytest.raises(collectives.InvalidBufferError, match=r"shape \(6,\)"):
        persistent.rebind(np.ones(6, np.float32))
    shares = collectives.reduce_scatter_init(np.ones(2 * world.size), comm=comm)
    with problems.guard("not an allreduce"), pytest.raises(collectives.PersistentStateError, match="rebound"):
        shares.rebind(np.ones(2 * world.size))
    comm.free()
    problems.check()


@pytest.mark.parametrize("check", [True, False])
def test_allreduce_init_with_and_without_checking_and_a_custom_op(world: MPI.Intracomm, check: bool) -> None:
    from tests.test_custom_ops import matmul2

    comm = collectives.Communicator(world, check=check)
    problems = Problems(world)
    matmul = collectives.Op(matmul2, commutative=False)
    matrices = np.zeros(4 * 7, np.uint32)
    product = collectives.allreduce_init(matrices, matmul, comm=comm)
    x = np.zeros(5, np.int32)
    total = collectives.allreduce_init(x, out=x, comm=comm)
    for start in range(STARTS):
        matrices[:] = np.random.default_rng(10 * start + world.rank).integers(0, 2**31, matrices.size)
        expected = world.allgather(matrices.copy())
        ordered = expected[0]
        for part in expected[1:]:
            ordered = matmul2(ordered, part)
        problems.expect_equal(f"matmul start {start}", product(), ordered)
        x[:] = world.rank + start
        reference = mpi_reference("allreduce", x, "sum", world)
        problems.expect_equal(f"sum start {start}", total(), reference)
    comm.free()
    problems.check()


def test_lean_starts_in_a_row_share_a_flight_recorder_entry(world: MPI.Intracomm) -> None:
    comm = collectives.Communicator(world)
    problems = Problems(world)
    x = np.ones(3)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    for _ in range(5):
        persistent()
    collectives.barrier(comm)
    persistent()
    record = comm.watchdog.flight_record_text()
    if persistent.lean:
        # each start may have had to wait, and so have a line of its own: count them all
        lines = [line for line in record.splitlines() if " allreduce count=3 " in line]
        counted = sum(int(line.split("starts=")[1].split()[0]) if "starts=" in line else 1 for line in lines)
        problems.expect(counted == 6, f"{counted} starts recorded, not 6:\n{record}")
        problems.expect("barrier" in record, record)
    comm.free()
    problems.check()


def test_a_lean_start_pairs_with_a_plain_one(world: MPI.Intracomm) -> None:
    # both sign the algorithm the init chose, whichever path a rank takes (rank 1's is the plain call)
    if world.size == 1:
        pytest.skip("ranks can differ only where there are several")
    comm = collectives.Communicator(world, timeout=60)
    problems = Problems(world)
    x = np.ones(4, np.float32)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    comm.watchdog.debug = world.rank == 1
    for start in range(3):
        x[:] = 1
        with problems.guard(f"start {start}"):
            problems.expect_equal(f"start {start}", persistent(), np.full(4, world.size, np.float32))
    comm.watchdog.debug = False
    problems.expect(persistent.lean or world.rank == 1, "rank 0's starts did not take the lean path")
    comm.free()
    problems.check()
