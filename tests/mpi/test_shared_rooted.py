"""Under mpiexec: broadcast, reduce and barrier on one node's shared memory, first calls and repeats."""

import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import MismatchError
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

TIMEOUT_S = 20.0
"""The communicator's timeout: a rank left waiting raises CollectiveTimeout after this."""

COUNTS = [0, 1, 1001, 300_007]
"""Nothing, one element, odd, and past one segment of the window (several segments)."""

CALLS = 3
"""Calls of each key: the first decides, the later ones repeat its decisions (the lean path)."""


def _sharing(world: MPI.Intracomm) -> collectives.Communicator:
    comm = collectives.Communicator(world, timeout=TIMEOUT_S, check=True)
    assert comm.features is not None  # collective: sets up the shared memory, and agreement through it
    return comm


def _roots(world: MPI.Intracomm) -> list[int]:
    return sorted({0, world.size - 1})


def _on_shared_memory(comm: collectives.Communicator) -> bool:
    return "shared_memory" in comm.features


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int8"])
def test_broadcast_matches_mpi_and_the_message_path(world: MPI.Intracomm, dtype: str) -> None:
    problems = Problems(world)
    comm = _sharing(world)
    for root in _roots(world):
        for count in COUNTS:
            for i in range(CALLS):
                label = f"root={root} count={count} call {i}"
                x = (np.arange(count) * 7 + world.rank * 3 + i).astype(dtype)
                expected = x.copy()
                world.Bcast(expected, root=root)
                with problems.guard(label):
                    for algorithm in ("shared_memory", "auto"):
                        fresh = collectives.broadcast(x, root, algorithm=algorithm, comm=comm)
                        problems.expect_equal(f"{label} {algorithm} fresh", fresh, expected)
                        out = np.zeros_like(x)
                        given = collectives.broadcast(x, root, out=out, algorithm=algorithm, comm=comm)
                        problems.expect(given is out, f"{label} {algorithm}: out= not returned")
                        problems.expect_equal(f"{label} {algorithm} out=", out, expected)
                        y = x.copy()
                        collectives.broadcast(y, root, out=y, algorithm=algorithm, comm=comm)
                        problems.expect_equal(f"{label} {algorithm} in place", y, expected)
                    by_messages = collectives.broadcast(x, root, algorithm="direct", comm=comm)
                    problems.expect_equal(f"{label} direct", by_messages, expected)
    _expect_kept(problems, comm, "broadcast")
    comm.free()
    problems.check()


@pytest.mark.parametrize("op", ["sum", "prod", "min", "max"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_reduce_matches_mpi_and_the_message_path(world: MPI.Intracomm, dtype: str, op: str) -> None:
    problems = Problems(world)
    comm = _sharing(world)
    for root in _roots(world):
        at_root = world.rank == root
        for count in COUNTS:
            for i in range(CALLS):
                label = f"root={root} count={count} call {i}"
                x = np.roll(exact_input(op, dtype, count, world.rank, world.size), i)  # new data each call
                expected = mpi_reference("reduce", x, op, world, root=root)
                with problems.guard(label):
                    for algorithm in ("shared_memory", "auto", "direct"):
                        fresh = collectives.reduce(x, op, root, algorithm=algorithm, comm=comm)
                        out = np.zeros_like(x)
                        given = collectives.reduce(x, op, root, out=out, algorithm=algorithm, comm=comm)
                        y = x.copy()
                        collectives.reduce(y, op, root, out=y, algorithm=algorithm, comm=comm)
                        if at_root:
                            problems.expect_equal(f"{label} {algorithm} fresh", fresh, expected)
                            problems.expect(given is out, f"{label} {algorithm}: out= not returned")
                            problems.expect_equal(f"{label} {algorithm} out=", out, expected)
                            problems.expect_equal(f"{label} {algorithm} in place", y, expected)
                        else:
                            off_root = fresh is None and given is None
                            problems.expect(off_root, f"{label}: a result off the root")
                            problems.expect(not out.any(), f"{label} {algorithm}: out written off the root")
                            problems.expect_equal(f"{label} {algorithm}: x changed off the root", y, x)
    _expect_kept(problems, comm, "reduce")
    comm.free()
    problems.check()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_a_reduce_of_random_floats_has_the_allreduces_bits(world: MPI.Intracomm, dtype: str) -> None:
    """The root combines every rank's part in rank order, as the shared-memory allreduce does."""
    problems = Problems(world)
    comm = _sharing(world)
    for count in (3, 1003, 300_007):
        x = np.random.default_rng([world.rank, count]).normal(size=count).astype(dtype)
        everyone = collectives.allreduce(x, algorithm="shared_memory", comm=comm)
        in_order = np.concatenate(world.allgather(x)).reshape(world.size, count)
        total = in_order[0].copy()
        for part in in_order[1:]:
            total += part
        problems.expect_equal(f"allreduce of {count} in rank order", everyone, total)
        for root in _roots(world):
            for i in range(CALLS):
                with problems.guard(f"root={root} count={count} call {i}"):
                    reduced = collectives.reduce(x, root=root, algorithm="shared_memory", comm=comm)
                    if world.rank == root:
                        problems.expect_equal(f"root={root} count={count} call {i}", reduced, everyone)
                    if root == 0:  # the star reduces in rank order at rank 0 too
                        direct = collectives.reduce(x, root=root, algorithm="direct", comm=comm)
                        if world.rank == root:
                            problems.expect_equal(f"direct, count={count} call {i}", direct, everyone)
    comm.free()
    problems.check()


def test_avg_and_shapes_on_the_repeated_path(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    comm = _sharing(world)
    root = world.size - 1
    for shape in [(), (5, 3), (2, 300_000)]:
        for i in range(CALLS):
            x = np.full(shape, world.rank + i, np.float64)
            with problems.guard(f"shape {shape} call {i}"):
                mean = collectives.reduce(x, "avg", root, comm=comm)
                if world.rank == root:
                    expected = np.full(shape, (world.size - 1) / 2 + i, np.float64)
                    problems.expect_equal(f"avg of shape {shape} call {i}", mean, expected)
                rooted = np.full(shape, root + i, np.float64)
                got = collectives.broadcast(x, root, comm=comm)
                problems.expect_equal(f"broadcast of {shape} {i}", got, rooted)
                strided = np.zeros((*shape, 2))[..., 0]  # not contiguous: the repeat copies through a buffer
                collectives.broadcast(x, root, out=strided, comm=comm)
                problems.expect_equal(f"broadcast into a strided out {i}", strided, rooted)
    comm.free()
    problems.check()


def test_a_repeated_barrier_waits_for_every_rank_and_sends_no_message(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    comm = _sharing(world)
    folder = world.bcast(tempfile.mkdtemp() if world.rank == 0 else None, root=0)
    received = comm.watchdog.agreement.received
    for buffer in received:  # the signatures' buffers, which a message would have written
        buffer[:] = bytes(len(buffer))
    for i in range(2 * CALLS):
        late = i % world.size  # each rank in turn arrives last, after leaving a mark
        mark = os.path.join(folder, f"mark-{i}")
        if world.rank == late:
            time.sleep(0.05)
            with open(mark, "w"):
                pass
        with problems.guard(f"barrier {i}"):
            collectives.barrier(comm=comm)
            problems.expect(os.path.exists(mark), f"barrier {i} returned before rank {late} arrived")
    problems.expect(not any(any(r) for r in received), "a signature came by message")
    if world.size > 1 and _on_shared_memory(comm):
        records = comm.flight_record()
        problems.expect(
            any("barrier" in ln and "shared_memory" in ln and "repeated calls=" in ln for ln in records),
            f"no lean repeats of the barrier in {records[-3:]}",
        )
    world.Barrier()
    if world.rank == 0:
        for name in os.listdir(folder):
            os.remove(os.path.join(folder, name))
        os.rmdir(folder)
    comm.free()
    problems.check()


Call = Callable[[collectives.Communicator, np.ndarray], Any]

# (what differs, the call on the other ranks, the call on the last rank)
MISMATCHES: list[tuple[str, Call, Call]] = [
    ("root", lambda c, x: collectives.broadcast(x, 0, comm=c),
     lambda c, x: collectives.broadcast(x, c.size - 1, comm=c)),
    ("root", lambda c, x: collectives.reduce(x, root=0, comm=c),
     lambda c, x: collectives.reduce(x, root=c.size - 1, comm=c)),
    ("op", lambda c, x: collectives.reduce(x, "sum", comm=c),
     lambda c, x: collectives.reduce(x, "max", comm=c)),
    ("count", lambda c, x: collectives.broadcast(x, comm=c),
     lambda c, x: collectives.broadcast(x[:-1], comm=c)),
    ("collective", lambda c, x: collectives.barrier(comm=c),
     lambda c, x: collectives.broadcast(x, comm=c)),
    ("collective", lambda c, x: collectives.reduce(x, comm=c),
     lambda c, x: collectives.barrier(comm=c)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("field", "others", "last"), MISMATCHES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MISMATCHES)]
)
@pytest.mark.parametrize("count", [4, 300_007])
def test_a_mismatch_fails_every_rank_and_the_next_calls_are_right(
    world: MPI.Intracomm, field: str, others: Call, last: Call, count: int
) -> None:
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    problems = Problems(world)
    comm = _sharing(world)
    x = np.ones(count, np.float32)
    for _ in range(2):  # the second call of the key runs on the first one's decisions
        others(comm, x.copy())
    started = time.monotonic()
    try:
        (last if world.rank == world.size - 1 else others)(comm, x.copy())
        problems.expect(False, f"a call differing in {field} did not raise")
    except MismatchError as error:
        problems.expect(field in error.fields, f"fields {error.fields}")
    problems.expect(time.monotonic() - started < TIMEOUT_S / 2, "took too long to raise")
    for i in range(CALLS):  # the ranks are in step, and the halves of the window too
        with problems.guard(f"call {i} after a mismatch in {field}"):
            y = np.arange(count, dtype=np.float32) + world.rank
            got = collectives.broadcast(y, 0, comm=comm)
            problems.expect_equal(f"broadcast {i}", got, np.arange(count, dtype=np.float32))
            reduced = collectives.reduce(y, root=world.size - 1, comm=comm)
            if world.rank == world.size - 1:
                expected = np.arange(count, dtype=np.float32) * world.size + sum(range(world.size))
                problems.expect_equal(f"reduce {i}", reduced, expected)
            collectives.barrier(comm=comm)
            z = np.ones(count, np.float32)
            collectives.allreduce(z, out=z, comm=comm)
            problems.expect_equal(f"allreduce {i}", z, np.full(count, world.size, np.float32))
    comm.free()
    problems.check()


def test_without_checks_the_repeats_still_synchronise(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=TIMEOUT_S, check=False)
    for i in range(CALLS):
        x = np.full(1001, world.rank + i, np.float32)
        with problems.guard(f"call {i}"):
            got = collectives.broadcast(x, 0, comm=comm)
            problems.expect_equal(f"broadcast {i}", got, np.full(1001, i, np.float32))
            reduced = collectives.reduce(x, root=0, comm=comm)
            if world.rank == 0:
                expected = np.full(1001, sum(range(world.size)) + world.size * i, np.float32)
                problems.expect_equal(f"reduce {i}", reduced, expected)
            collectives.barrier(comm=comm)
            collectives.broadcast(np.zeros(0, np.float32), 0, comm=comm)  # nothing to move
    comm.free()
    problems.check()


def _expect_kept(problems: Problems, comm: collectives.Communicator, collective: str) -> None:
    """On shared memory, a later call of a key ran on the first one's decisions, lean."""
    if comm.size == 1 or not _on_shared_memory(comm):
        return
    kept = [repeat for key, repeat in comm.repeats.items() if key[0] == collective]
    problems.expect(bool(kept), f"no {collective} repeat kept")
    lean = all(getattr(r, "lean", None) is not None for r in kept)
    problems.expect(lean, f"a {collective} repeat not lean")
