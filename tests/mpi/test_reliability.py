"""Under mpiexec: threads, interrupted calls, freed communicators and MPI's own errors end in a clear error.

Never a wrong result, a hang or a segfault: each test combines every rank's verdict before asserting.
Interruptions are injected at a chosen point of a chosen call (a wrapped transport or shared memory),
so each test is deterministic.
"""

import threading
import time
from typing import Any

import numpy as np
import pytest
from mpi4py import MPI

import collectives
from collectives import (
    BrokenCommunicatorError,
    CollectivesError,
    ConcurrentCallError,
    FreedCommunicatorError,
    PeerFailedError,
    engine,
)
from collectives.transport.tags import Tag
from tests.mpi.helpers import Problems

pytestmark = pytest.mark.mpi

COUNT = 100_000  # past the data that travels with a signature


def test_a_second_threads_call_is_refused_and_breaks_the_communicator_everywhere(
    world: MPI.Intracomm,
) -> None:
    if world.size == 1:
        pytest.skip("one rank never waits for a peer")
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=30.0)
    x = np.full(COUNT, world.rank + 1, np.float32)
    expected = world.size * (world.size + 1) / 2
    collectives.allreduce(x, comm=comm)  # set up, so the call below waits only for its peers
    results: list[Any] = []

    def background() -> None:
        if world.rank != 0:
            time.sleep(1.0)  # rank 0's call waits for this rank meanwhile
        try:
            results.append(collectives.allreduce(x, comm=comm))
        except CollectivesError as error:
            results.append(error)

    thread = threading.Thread(target=background, name="reducer")
    thread.start()
    if world.rank == 0:
        time.sleep(0.3)  # the reducer's call is running, waiting for the others
        try:
            collectives.allreduce(x, comm=comm)
            problems.expect(False, "a call while another thread's ran was not refused")
        except ConcurrentCallError as error:
            problems.expect(
                error.running == "thread 'reducer'" and error.calling == "thread 'MainThread'", str(error)
            )
            problems.expect("'reducer'" in str(error) and "'MainThread'" in str(error), str(error))
    thread.join()
    for result in results:  # the reducer's call runs or fails; it never returns a wrong sum
        if not isinstance(result, CollectivesError):
            problems.expect(bool((result == expected).all()), f"the reducer got {result[:4]}")
    # rank 0 broke the communicator: every rank's next call says so, naming it
    try:
        collectives.allreduce(x, comm=comm)
        problems.expect(False, "the call after a refused concurrent call ran")
    except BrokenCommunicatorError as error:
        problems.expect(error.rank == 0, f"broken by {error.rank}: {error}")
    problems.check()


@pytest.mark.parametrize("algorithm", ["ring", "shared_memory"])
def test_an_interrupted_call_breaks_the_communicator_on_every_rank(
    world: MPI.Intracomm, algorithm: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 is interrupted in the middle of its third allreduce and keeps calling, as do the others.

    The interrupt comes from the Python barrier's arrival, so the ranks run the Python
    path (every rank: they agree on it); tests/mpi/test_engine.py interrupts the compiled
    path where it hands a late barrier's wait to Python.
    """
    if world.size == 1:
        pytest.skip("needs a peer to interrupt")
    monkeypatch.setattr(engine, "COMPILED", None)
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=30.0)
    x = np.full(COUNT, world.rank + 1, np.float32)
    expected = world.size * (world.size + 1) / 2
    collectives.allreduce(x, algorithm=algorithm, comm=comm)  # finds the nodes
    if algorithm == "shared_memory" and "shared_memory" not in comm.features:
        pytest.skip("the ranks share no memory")
    victim = 1
    if world.rank == victim:
        _interrupt_in_call(comm, algorithm, sequence=2)
    broken_by: list[int | None] = []
    for call in range(1, 8):
        try:
            result = collectives.allreduce(x, algorithm=algorithm, comm=comm)
            problems.expect(not broken_by, f"call {call} ran on a broken communicator")
            problems.expect(bool((result == expected).all()), f"call {call} gave {result[:4]}")
        except KeyboardInterrupt:
            problems.expect(world.rank == victim and call == 2, f"interrupted in call {call}")
            broken_by.append(victim)  # the user caught it and keeps calling
        except BrokenCommunicatorError as error:
            broken_by.append(error.rank)
            problems.expect(f"rank {victim}" in str(error), str(error))
    problems.expect(len(broken_by) >= 5 and set(broken_by) == {victim}, f"broken by {broken_by}")
    problems.check()


def _interrupt_in_call(comm: collectives.Communicator, algorithm: str, sequence: int) -> None:
    """Raise KeyboardInterrupt in call ``sequence``, after its second data send or barrier."""
    watchdog = comm.watchdog
    seen = 0
    if algorithm == "shared_memory":
        shared = comm.transport.shared_memory()
        assert shared is not None
        arrive = shared.arrive

        def arriving(note: Any = ()) -> None:
            nonlocal seen
            if watchdog.sequence - 1 == sequence:
                seen += 1
                if seen == 2:
                    raise KeyboardInterrupt
            arrive(note)

        shared.arrive = arriving  # type: ignore[method-assign]
        return
    transport = comm.transport
    send = transport.isend

    def sending(buffer: Any, dst: int, tag: int) -> Any:
        nonlocal seen
        request = send(buffer, dst, tag)
        if tag == Tag.DATA and watchdog.sequence - 1 == sequence:
            seen += 1
            if seen == 2:
                raise KeyboardInterrupt
        return request

    transport.isend = sending  # type: ignore[method-assign]


def test_a_freed_communicator_refuses_calls_and_its_arrays_stay_usable(world: MPI.Intracomm) -> None:
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=30.0)
    shared = comm.alloc(1000, np.float32)
    shared[:] = world.rank + 1
    with problems.guard("allreduce of alloc memory"):
        collectives.allreduce(shared, out=shared, algorithm="auto", comm=comm)
    comm.free()
    comm.free()  # again: nothing
    for what, attempt in [
        ("allreduce", lambda: collectives.allreduce(np.ones(4, np.float32), comm=comm)),
        ("prepared allreduce", lambda: collectives.allreduce(shared, out=shared, comm=comm)),
        ("allgather", lambda: collectives.allgather(np.ones(4, np.float32), comm=comm)),
        ("alloc", lambda: comm.alloc(8)),
    ]:
        try:
            attempt()
            problems.expect(False, f"{what} after free() ran")
        except FreedCommunicatorError as error:
            problems.expect("freed" in str(error), str(error))
    # its memory lives on: reading and writing it is no segfault
    expected = world.size * (world.size + 1) / 2
    problems.expect(bool((shared == expected).all()), f"alloc memory after free: {shared[:4]}")
    shared[:] = 7
    problems.expect(float(shared.sum()) == 7000, "alloc memory not writable after free")
    problems.check()


def test_an_mpi_failure_names_the_call_and_peer_and_breaks_the_communicator(world: MPI.Intracomm) -> None:
    """Rank 1's receive of the second call's first ring step is too short: MPI fails it (truncated)."""
    if world.size == 1:
        pytest.skip("needs a peer")
    problems = Problems(world)
    comm = collectives.Communicator(world, timeout=30.0)
    x = np.full(COUNT, world.rank + 1, np.float32)
    expected = world.size * (world.size + 1) / 2
    victim, left = 1, 0  # in the ring, rank 1 receives from rank 0
    if world.rank == victim:
        transport, watchdog = comm.transport, comm.watchdog
        receive = transport.irecv
        cut = False

        def truncating(buffer: Any, src: int, tag: int) -> Any:
            nonlocal cut
            if tag == Tag.DATA and watchdog.sequence - 1 == 1 and not cut:
                cut = True
                buffer = memoryview(buffer).cast("B")[:-4]
            return receive(buffer, src, tag)

        transport.irecv = truncating  # type: ignore[method-assign]
    outcomes = []
    for call in range(4):
        try:
            result = collectives.allreduce(x, algorithm="ring", comm=comm)
            problems.expect(bool((result == expected).all()), f"call {call} gave {result[:4]}")
            outcomes.append("ok")
        except PeerFailedError as error:
            outcomes.append("failed")
            problems.expect(world.rank == victim and call == 1, f"call {call}: {error}")
            problems.expect(
                (error.collective, error.sequence, error.peers) == ("allreduce", 1, (left,)), str(error)
            )
            problems.expect("allreduce #1" in str(error) and "rank 0" in str(error), str(error))
            problems.expect(isinstance(error.__cause__, CollectivesError), repr(error.__cause__))
        except BrokenCommunicatorError as error:
            outcomes.append("broken")
            problems.expect(error.rank == victim, str(error))
    problems.expect(outcomes[0] == "ok" and "ok" not in outcomes[2:], f"outcomes {outcomes}")
    problems.check()
