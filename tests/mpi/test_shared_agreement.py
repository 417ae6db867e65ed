"""Under mpiexec: once a communicator's ranks share memory, they agree on each call through a barrier."""

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import InvalidBufferError, MismatchError, PeerInputError
from tests.mpi.helpers import Problems, exact_input, mpi_reference

pytestmark = pytest.mark.mpi

TIMEOUT_S = 20.0
"""The communicator's timeout: a rank left waiting raises CollectiveTimeout after this."""

# small (one barrier), one segment, and several segments of the executor
COUNTS = [2, 1000, 300_007]


def _sharing(world: MPI.Intracomm) -> collectives.Communicator:
    comm = collectives.Communicator(world, timeout=TIMEOUT_S, check=True)
    assert comm.features is not None  # collective: sets up the shared memory, and agreement through it
    return comm


def _all_right(problems: Problems, comm: collectives.Communicator, world: MPI.Intracomm, label: str) -> None:
    """Allreduces by every route after ``label``: the ranks are in step, and the halves of the regions too."""
    for count in COUNTS:
        x = exact_input("sum", "float32", count, world.rank, world.size)
        expected = mpi_reference("allreduce", x, "sum", world)
        for algorithm in ("shared_memory", "auto", "ring", "shared_memory"):
            with problems.guard(f"{algorithm} of {count} after {label}"):
                y = x.copy()
                collectives.allreduce(y, out=y, algorithm=algorithm, comm=comm)
                problems.expect_equal(f"{algorithm} of {count} after {label}", y, expected)


def test_signatures_go_through_shared_memory_and_results_stay_right(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("one rank agrees with itself without a barrier")
    problems = Problems(world)
    comm = _sharing(world)
    watchdog = comm.watchdog
    problems.expect(
        watchdog.shared is not None and comm.shared is not None and watchdog.shared is comm.shared.shared,
        "the watchdog does not agree through the communicator's shared memory",
    )
    # setting the shared memory up is itself a watched call, agreed by message: forget those
    for received in watchdog.agreement.received:
        received[:] = bytes(len(received))
    _all_right(problems, comm, world, "the switch")
    # no signature went by message: the buffers the exchange receives into were never written
    problems.expect(not any(any(r) for r in watchdog.agreement.received), "a signature came by message")
    comm.free()
    problems.check()


Call = Callable[[collectives.Communicator, np.ndarray], Any]

# (what differs, call on the other ranks, call on the last rank)
MISMATCHES: list[tuple[str, Call, Call]] = [
    ("count", lambda c, x: collectives.allreduce(x, algorithm="shared_memory", comm=c),
     lambda c, x: collectives.allreduce(x[:-1], algorithm="shared_memory", comm=c)),
    ("algorithm", lambda c, x: collectives.allreduce(x, algorithm="shared_memory", comm=c),
     lambda c, x: collectives.allreduce(x, algorithm="ring", comm=c)),
    ("collective", lambda c, x: collectives.allreduce(x, out=x, algorithm="shared_memory", comm=c),
     lambda c, x: collectives.broadcast(x, root=0, comm=c)),
    ("op", lambda c, x: collectives.allreduce(x, out=x, algorithm="shared_memory", comm=c),
     lambda c, x: collectives.allreduce(x, "max", out=x, algorithm="shared_memory", comm=c)),
]  # fmt: skip


@pytest.mark.parametrize(("field", "others", "last"), MISMATCHES, ids=[m[0] for m in MISMATCHES])
@pytest.mark.parametrize("count", [4, 300_007])
def test_a_mismatch_through_shared_memory_fails_every_rank_and_the_next_calls_are_right(
    world: MPI.Intracomm, field: str, others: Call, last: Call, count: int
) -> None:
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    problems = Problems(world)
    comm = _sharing(world)
    took = _a_mismatch_raises(problems, comm, world, field, others, last, np.ones(count, np.float32))
    problems.expect(took < TIMEOUT_S / 2, f"took {took:.1f} s to raise")
    _all_right(problems, comm, world, f"a mismatch in {field}")
    comm.free()
    problems.check()


def _a_mismatch_raises(
    problems: Problems,
    comm: collectives.Communicator,
    world: MPI.Intracomm,
    field: str,
    others: Call,
    last: Call,
    x: np.ndarray,
) -> float:
    """Run ``others`` twice (the second call prepared), then ``last`` on the last rank; seconds to raise."""
    for _ in range(2):
        others(comm, x.copy())
    started = time.monotonic()
    try:
        (last if world.rank == world.size - 1 else others)(comm, x.copy())
        problems.expect(False, f"a call differing in {field} did not raise")
    except MismatchError as error:
        problems.expect(field in error.fields, f"fields {error.fields}")
    return time.monotonic() - started


def test_a_bad_call_on_one_rank_through_shared_memory_fails_every_rank(world: MPI.Intracomm) -> None:
    if world.size == 1:
        pytest.skip("needs a good rank beside the bad one")
    problems = Problems(world)
    comm = _sharing(world)
    x = np.ones(300_007, np.float32)
    for _ in range(2):
        collectives.allreduce(x.copy(), algorithm="shared_memory", comm=comm)
    try:
        if world.rank == world.size - 1:
            collectives.allreduce(x, out=np.empty(3, np.float32), algorithm="shared_memory", comm=comm)
        else:
            collectives.allreduce(x.copy(), algorithm="shared_memory", comm=comm)
        problems.expect(False, "no error")
    except PeerInputError as error:
        problems.expect(world.rank != world.size - 1 and list(error.problems) == [world.size - 1], str(error))
    except InvalidBufferError:
        problems.expect(world.rank == world.size - 1, "a good rank raised the bad rank's error")
    _all_right(problems, comm, world, "a bad call")
    comm.free()
    problems.check()


@pytest.mark.parametrize("per_rank", [1, 1000, 100_003])  # small (one barrier), one segment, several
def test_repeated_reduce_scatters_and_allgathers_take_the_prepared_path_and_stay_right(
    world: MPI.Intracomm, per_rank: int
) -> None:
    problems = Problems(world)
    comm = _sharing(world)
    p, r = world.size, world.rank
    out = np.empty(per_rank, np.float32)
    gathered = np.empty(per_rank * p, np.float32)
    for i in range(3):  # the first call of each kind decides; the next ones reuse its decisions
        rng = np.random.default_rng([r, i, per_rank])
        x = rng.integers(-100, 100, per_rank * p).astype(np.float32)
        mine = x[:per_rank].copy()
        with problems.guard(f"call {i} of {per_rank} per rank"):
            for op in ("sum", "avg"):
                expected = mpi_reference("reduce_scatter", x, op, world)
                problems.expect_equal(f"rs {op} {i}", collectives.reduce_scatter(x, op, comm=comm), expected)
                collectives.reduce_scatter(x, op, out=out, comm=comm)
                problems.expect_equal(f"rs {op} out= {i}", out, expected)
            expected = np.concatenate(world.allgather(mine))
            problems.expect_equal(f"ag {i}", collectives.allgather(mine, comm=comm), expected)
            collectives.allgather(mine, out=gathered, comm=comm)
            problems.expect_equal(f"ag out= {i}", gathered, expected)
    kinds = {key[0] for key in comm.repeats if isinstance(key[0], str)}
    problems.expect(p == 1 or kinds == {"reduce_scatter", "allgather"}, f"prepared {kinds}")
    comm.free()
    problems.check()


# (what differs, call on the other ranks, call on the last rank), on x of 2 * P elements
SHARE_MISMATCHES: list[tuple[str, Call, Call]] = [
    ("count", lambda c, x: collectives.reduce_scatter(x, comm=c),
     lambda c, x: collectives.reduce_scatter(x[: -c.size], comm=c)),
    ("op", lambda c, x: collectives.reduce_scatter(x, comm=c),
     lambda c, x: collectives.reduce_scatter(x, "max", comm=c)),
    ("collective", lambda c, x: collectives.reduce_scatter(x, comm=c),
     lambda c, x: collectives.allgather(x, comm=c)),
    ("count", lambda c, x: collectives.allgather(x, comm=c),
     lambda c, x: collectives.allgather(x[:-1], comm=c)),
]  # fmt: skip


@pytest.mark.parametrize(("field", "others", "last"), SHARE_MISMATCHES)
def test_a_mismatch_after_prepared_reduce_scatters_or_allgathers_fails_every_rank(
    world: MPI.Intracomm, field: str, others: Call, last: Call
) -> None:
    if world.size == 1:
        pytest.skip("needs two ranks to disagree")
    problems = Problems(world)
    comm = _sharing(world)
    _a_mismatch_raises(problems, comm, world, field, others, last, np.ones(2 * world.size, np.float32))
    _all_right(problems, comm, world, f"a mismatch in {field}")
    comm.free()
    problems.check()


def _strided(x: np.ndarray) -> np.ndarray:
    """``x``'s values in a view that is not contiguous."""
    room = np.zeros(2 * x.size, x.dtype)
    room[::2] = x
    return room[::2]


@pytest.mark.parametrize("per_rank", [1, 1000, 100_003])
def test_repeats_whose_arrays_differ_on_one_rank_keep_step_with_the_others(
    world: MPI.Intracomm, per_rank: int
) -> None:
    """Strides and overlap are one rank's own business: a repeat with them must not leave the prepared path.

    The last rank's third call of each kind passes a strided ``x``, a strided
    ``out``, or (all-gather with counts) its ``x`` inside ``out``; the others
    repeat the first call's arrays. A rank that took another path than the
    others would leave them waiting until the timeout.
    """
    problems = Problems(world)
    comm = _sharing(world)
    p, r = world.size, world.rank
    counts = [per_rank * (k % 2) + (k == 0) for k in range(p)]  # uneven, some ranks empty
    edge = sum(counts[:r])
    for i in range(3):
        odd = i == 2 and r == p - 1
        rng = np.random.default_rng([r, i, per_rank])
        x = rng.integers(-100, 100, per_rank * p).astype(np.float32)
        with problems.guard(f"call {i} of {per_rank} per rank"):
            expected = mpi_reference("allreduce", x, "sum", world)
            y = np.empty_like(x)
            collectives.allreduce(_strided(x) if odd else x, out=y, comm=comm)
            problems.expect_equal(f"allreduce {i}", y, expected)

            expected = mpi_reference("reduce_scatter", x, "sum", world)
            out = _strided(np.empty(per_rank, np.float32)) if odd else np.empty(per_rank, np.float32)
            collectives.reduce_scatter(_strided(x) if odd else x, out=out, comm=comm)
            problems.expect_equal(f"reduce_scatter {i}", out, expected)

            gathered = np.zeros(sum(counts), np.float32)
            mine = gathered[edge : edge + counts[r]]
            mine[...] = r + i
            expected = np.concatenate([np.full(c, k + i, np.float32) for k, c in enumerate(counts)])
            collectives.allgather(_strided(mine) if odd else mine, counts=counts, out=gathered, comm=comm)
            problems.expect_equal(f"allgather in place {i}", gathered, expected)
    comm.free()
    problems.check()
