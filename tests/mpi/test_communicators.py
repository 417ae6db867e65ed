"""The communicators the collectives accept, and the user's own traffic beside them."""

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives.transport.tags import Tag
from tests.mpi.helpers import Problems, exact_input, gather_input, mpi_reference

pytestmark = pytest.mark.mpi


@contextmanager
def _world() -> Iterator[tuple[Any, MPI.Intracomm]]:
    yield MPI.COMM_WORLD, MPI.COMM_WORLD


@contextmanager
def _wrapped_world() -> Iterator[tuple[Any, MPI.Intracomm]]:
    communicator = collectives.Communicator(MPI.COMM_WORLD)
    try:
        yield communicator, MPI.COMM_WORLD
    finally:
        communicator.free()


@contextmanager
def _default() -> Iterator[tuple[Any, MPI.Intracomm]]:
    yield None, MPI.COMM_WORLD


@contextmanager
def _split() -> Iterator[tuple[Any, MPI.Intracomm]]:
    # even and odd ranks: two groups running at once, of different sizes when P is odd
    half = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2)
    try:
        yield half, half
    finally:
        half.Free()


@contextmanager
def _wrapped_split() -> Iterator[tuple[Any, MPI.Intracomm]]:
    half = MPI.COMM_WORLD.Split(MPI.COMM_WORLD.rank % 2)
    communicator = collectives.Communicator(half)
    try:
        yield communicator, half
    finally:
        communicator.free()
        half.Free()


COMMUNICATORS: dict[str, Callable[[], Any]] = {
    "COMM_WORLD": _world,
    "Communicator(COMM_WORLD)": _wrapped_world,
    "default": _default,
    "Split(rank % 2)": _split,
    "Communicator(Split(rank % 2))": _wrapped_split,
}


@pytest.mark.parametrize("kind", COMMUNICATORS)
def test_collectives_on_each_communicator(kind: str, world: MPI.Intracomm) -> None:
    problems = Problems(world)
    with COMMUNICATORS[kind]() as (comm, group):
        rank, size = group.rank, group.size
        with problems.guard("Communicator"):
            if isinstance(comm, collectives.Communicator):
                problems.expect(
                    (comm.rank, comm.size) == (rank, size),
                    f"Communicator has rank {comm.rank} of {comm.size}, expected {rank} of {size}",
                )
        for count in (0, 1, size + 1, 1001):
            x = exact_input("sum", "float32", count, rank, size)
            expected = mpi_reference("allreduce", x, "sum", group)
            with problems.guard(f"allreduce count={count}"):
                result = collectives.allreduce(x, comm=comm)
                problems.expect_equal(f"allreduce count={count}", result, expected)
            x = exact_input("max", "int32", count * size, rank, size)
            expected = mpi_reference("reduce_scatter", x, "max", group)
            with problems.guard(f"reduce_scatter count={count}"):
                result = collectives.reduce_scatter(x, "max", comm=comm)
                problems.expect_equal(f"reduce_scatter count={count}", result, expected)
            x = gather_input("int16", (count,), rank)
            expected = np.empty(count * size, x.dtype)
            group.Allgather(x, expected)
            with problems.guard(f"allgather count={count}"):
                result = collectives.allgather(x, comm=comm)
                problems.expect_equal(f"allgather count={count}", result, expected)
    problems.check()


def _run_collectives(comm: Any, world: MPI.Intracomm, problems: Problems) -> None:
    """Run each collective once on ``comm`` (over COMM_WORLD) and check the results."""
    x = exact_input("sum", "int64", 3 * world.size + 1, world.rank, world.size)
    expected = mpi_reference("allreduce", x, "sum", world)
    with problems.guard("allreduce"):
        problems.expect_equal("allreduce", collectives.allreduce(x, comm=comm), expected)
    expected = mpi_reference("reduce_scatter", x[: world.size], "sum", world)
    with problems.guard("reduce_scatter"):
        result = collectives.reduce_scatter(x[: world.size], comm=comm)
        problems.expect_equal("reduce_scatter", result, expected)
    expected = np.empty(world.size * x.size, x.dtype)
    world.Allgather(x, expected)
    with problems.guard("allgather"):
        problems.expect_equal("allgather", collectives.allgather(x, comm=comm), expected)


@pytest.mark.parametrize("comm", [MPI.COMM_WORLD, None], ids=["COMM_WORLD", "default"])
def test_user_receive_posted_before_is_not_taken(comm: Any, world: MPI.Intracomm) -> None:
    # a receive for any tag from any source would match the library's messages were they on
    # the user's communicator rather than a Dup of it
    problems = Problems(world)
    inbox = np.full(4, -1, np.int64)
    status = MPI.Status()
    receive = world.Irecv(inbox, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG)
    _run_collectives(comm, world, problems)
    nxt, prev = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    send = world.Isend(np.full(4, 1000 + world.rank, np.int64), dest=nxt, tag=Tag.DATA)
    receive.Wait(status)
    send.Wait()
    problems.expect_equal("the user's message", inbox, np.full(4, 1000 + prev, np.int64))
    problems.expect(
        (status.source, status.tag) == (prev, Tag.DATA),
        f"the user's message came from {status.source} with tag {status.tag}, "
        f"expected {prev} with tag {Tag.DATA}",
    )
    problems.check()


@pytest.mark.parametrize("comm", [MPI.COMM_WORLD, None], ids=["COMM_WORLD", "default"])
def test_user_message_sent_before_is_not_taken(comm: Any, world: MPI.Intracomm) -> None:
    # a message with the library's own tag, waiting unreceived while the collectives run
    problems = Problems(world)
    nxt, prev = (world.rank + 1) % world.size, (world.rank - 1) % world.size
    send = world.Isend(np.full(4, 1000 + world.rank, np.int64), dest=nxt, tag=Tag.DATA)
    _run_collectives(comm, world, problems)
    inbox = np.full(4, -1, np.int64)
    world.Recv(inbox, source=prev, tag=Tag.DATA)
    send.Wait()
    problems.expect_equal("the user's message", inbox, np.full(4, 1000 + prev, np.int64))
    problems.check()


def test_mpi4py_communicator_is_duplicated_once(world: MPI.Intracomm) -> None:
    # more calls than MPICH has communicator ids (about 2000): they must share one Dup, not
    # leak one each; empty arrays keep the calls cheap, as they send nothing
    problems = Problems(world)
    empty = np.zeros(0, np.float64)
    with problems.guard("repeated allreduce"):
        for _ in range(3000):
            collectives.allreduce(empty, comm=world)
    problems.check()


def test_a_transport_over_some_world_ranks_is_numbered_in_their_order(world: MPI.Intracomm) -> None:
    from collectives.errors import ConfigurationError
    from collectives.transport.mpi import MPITransport

    problems = Problems(world)
    for ranks, rank in [([world.rank], world.rank + 1), ([world.rank + 1], world.rank)]:
        try:
            MPITransport.of_world_ranks(ranks, rank)  # local checks: no rank waits for another
        except ConfigurationError as error:
            problems.expect(str(rank) in str(error), f"{ranks}, {rank}: {error}")
        else:
            problems.expect(False, f"{ranks}, {rank}: no error")
    with problems.guard("the first ranks, reversed"):
        members = list(range(world.size - 1, -1, -1))[world.size // 2 :]  # the lower half, highest first
        if world.rank in members:
            transport = MPITransport.of_world_ranks(members, world.rank)
            communicator = collectives.Communicator(transport)
            position = members.index(world.rank)
            problems.expect((communicator.rank, communicator.size) == (position, len(members)), "rank, size")
            total = collectives.allreduce(np.full(3, world.rank, np.int64), comm=communicator)
            problems.expect_equal("allreduce", total, np.full(3, sum(members), np.int64))
            communicator.free()
    problems.check()
