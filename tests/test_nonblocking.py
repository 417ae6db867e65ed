"""Non-blocking collectives on loopback ranks: results, order with blocking calls, errors, progress, exit."""

import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import InvalidBufferError, PeerInputError, Request

from .conftest import run_ranks

_DEADLINE_S = 20.0  # a bound on waiting for progress, never a measure of speed


def test_every_i_collective_gives_its_blocking_twins_result() -> None:
    size = 3

    def body(comm: C.Communicator) -> list[Any]:
        r = comm.rank
        x = np.arange(6.0) + r
        rows = np.arange(6.0).reshape(size, 2) + 10 * r
        requests = [
            C.iallreduce(x, comm=comm),
            C.ireduce_scatter(rows, "max", comm=comm),
            C.iallgather(np.array([r]), comm=comm),
            C.ibroadcast(x.copy(), root=1, comm=comm),
            C.ireduce(x, "sum", root=2, comm=comm),
            C.igather(np.array([r, r]), root=0, comm=comm),
            C.iscatter(rows if r == 0 else None, root=0, out=np.empty((1, 2)), comm=comm),
            C.ialltoall(rows, comm=comm),
            C.ibarrier(comm),
        ]
        assert all(isinstance(q, Request) for q in requests)
        return C.wait_all(requests)

    results = run_ranks(size, body)
    for r, got in enumerate(results):
        x = [np.arange(6.0) + k for k in range(size)]
        rows = [np.arange(6.0).reshape(size, 2) + 10 * k for k in range(size)]
        assert np.array_equal(got[0], sum(x))
        assert np.array_equal(got[1], np.max(rows, axis=0)[r : r + 1])
        assert np.array_equal(got[2], np.arange(size))
        assert np.array_equal(got[3], x[1])
        assert np.array_equal(got[4], sum(x)) if r == 2 else got[4] is None
        assert np.array_equal(got[5], np.repeat(np.arange(size), 2)) if r == 0 else got[5] is None
        assert np.array_equal(got[6], rows[0][r : r + 1])
        assert np.array_equal(got[7], np.concatenate([rows[k][r : r + 1] for k in range(size)]))
        assert got[8] is None


def test_a_request_completes_while_the_caller_computes() -> None:
    """Overlap: the call completes without wait() being called; the caller computes meanwhile."""

    def body(comm: C.Communicator) -> tuple[bool, float, np.ndarray]:
        x = np.arange(1000.0) * (comm.rank + 1)
        request = C.iallreduce(x, out=x, comm=comm)
        computed = float(np.sum(np.sqrt(np.arange(10_000.0))))  # the overlapped computation
        deadline = time.monotonic() + _DEADLINE_S
        while not request.test() and time.monotonic() < deadline:
            time.sleep(0.001)
        return request.test(), computed, x

    for done, computed, x in run_ranks(3, body):
        assert done
        assert computed > 0
        assert np.array_equal(x, np.arange(1000.0) * 6)  # the buffer passed is the one written


def test_freeing_a_communicator_lets_its_started_calls_complete_first() -> None:
    """As MPI_Comm_free lets pending operations complete: free right after starting, then wait."""

    def body(comm: C.Communicator) -> list[Any]:
        x = np.arange(100_000.0) * (comm.rank + 1)
        requests = [C.iallreduce(x, comm=comm), C.iallgather(np.array([comm.rank]), comm=comm)]
        comm.free()
        return C.wait_all(requests)

    for total, ranks in run_ranks(3, body):
        assert np.array_equal(total, np.arange(100_000.0) * 6)
        assert ranks.tolist() == [0, 1, 2]


def test_blocking_calls_follow_the_started_ones_in_program_order() -> None:
    def body(comm: C.Communicator) -> list[Any]:
        r = comm.rank
        first = C.iallreduce(np.full(4, r + 1.0), comm=comm)
        second = C.iallreduce(np.full(4, 10.0 * (r + 1)), "max", comm=comm)
        blocking = C.allreduce(np.full(4, 100.0), comm=comm)  # waits for the two above, no error
        third = C.ibroadcast(np.full(2, float(r)), root=2, comm=comm)
        # ranks wait in different orders: waiting sends nothing
        if r % 2:
            return [first.wait(), second.wait(), blocking, third.wait()]
        later = third.wait(), second.wait()
        return [first.wait(), later[1], blocking, later[0]]

    for got in run_ranks(3, body):
        assert got[0].tolist() == [6.0] * 4
        assert got[1].tolist() == [30.0] * 4
        assert got[2].tolist() == [300.0] * 4
        assert got[3].tolist() == [2.0] * 2


def test_errors_surface_at_wait_and_test_on_every_rank() -> None:
    def body(comm: C.Communicator) -> tuple[type, type, np.ndarray]:
        x = np.arange(4.0) if comm.rank else np.arange(4.0).reshape(2, 2)
        bad = C.iallreduce(x, out=np.empty(4) if comm.rank == 0 else None, comm=comm)
        caught: list[type] = []
        for method in (bad.wait, bad.test):
            try:
                method()
            except (InvalidBufferError, PeerInputError) as error:
                caught.append(type(error))
        # the communicator is still usable afterwards
        return caught[0], caught[1], C.allreduce(np.ones(2), comm=comm)

    results = run_ranks(2, body)
    assert results[0][:2] == (InvalidBufferError, InvalidBufferError)
    assert results[1][:2] == (PeerInputError, PeerInputError)
    assert all(r[2].tolist() == [2.0, 2.0] for r in results)


def test_test_all_and_wait_all() -> None:
    def body(comm: C.Communicator) -> tuple[bool, list[Any]]:
        requests = [C.iallreduce(np.full(3, float(i)), comm=comm) for i in range(4)]
        results = C.wait_all(requests)
        return C.test_all(requests), results

    for done, results in run_ranks(2, body):
        assert done
        assert [r.tolist() for r in results] == [[2.0 * i] * 3 for i in range(4)]
        assert "done" in repr(Request("allreduce", _done_future()))


def _done_future() -> Any:
    from concurrent.futures import Future

    future: Future[Any] = Future()
    future.set_result(None)
    return future


def test_custom_ops_run_non_blocking() -> None:
    op = C.Op(np.logaddexp, identity=-np.inf)

    def body(comm: C.Communicator) -> np.ndarray:
        return C.iallreduce(np.full(5, float(comm.rank)), op, comm=comm).wait()

    expected = np.logaddexp.reduce(np.arange(4.0))
    for result in run_ranks(4, body):
        assert np.allclose(result, expected)


def test_the_lane_is_not_the_callers_thread() -> None:
    def body(comm: C.Communicator) -> tuple[str, str]:
        seen: list[str] = []
        op = C.Op(lambda a, b: seen.append(threading.current_thread().name) or a + b, name="spy")
        C.iallreduce(np.ones(2), op, comm=comm).wait()
        return threading.current_thread().name, seen[-1]

    for caller, lane in run_ranks(2, body):
        assert caller != lane and lane.startswith("collectives-requests")


_NEVER_WAITED = textwrap.dedent(
    """
    import numpy as np
    import collectives as C
    from collectives.transport.loopback import LoopbackWorld

    def body(transport):
        comm = C.Communicator(transport, timeout=30)
        for _ in range(3):
            C.iallreduce(np.ones(1 << 16), comm=comm)  # never waited for
        return comm

    kept = LoopbackWorld(3, timeout=30).run(body)
    print("started")
    """
)


def test_requests_never_waited_for_do_not_hang_the_exit() -> None:
    finished = subprocess.run(
        [sys.executable, "-c", _NEVER_WAITED], capture_output=True, text=True, timeout=120, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert "started" in finished.stdout


@pytest.mark.parametrize("level", ["funneled", "single"])
def test_without_threads_a_started_call_runs_at_once(level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.transport.loopback import LoopbackTransport

    monkeypatch.setattr(LoopbackTransport, "thread_level", property(lambda self: level))

    def body(comm: C.Communicator) -> tuple[bool, np.ndarray]:
        request = C.iallreduce(np.ones(3), comm=comm)
        return request.test(), request.wait()

    for done, result in run_ranks(2, body):
        assert done and result.tolist() == [2.0] * 3


def test_a_communicator_with_finished_requests_can_be_collected() -> None:
    import gc
    import weakref

    from collectives.transport.loopback import LoopbackWorld

    comm = C.Communicator(LoopbackWorld(1).transport(0))
    ref = weakref.ref(comm)
    assert C.iallreduce(np.ones(3), comm=comm).wait().tolist() == [1.0] * 3
    failed = C.iallreduce(np.ones(3), "no such op", comm=comm)
    with pytest.raises(C.UnsupportedOpError):
        failed.wait()
    del comm, failed
    gc.collect()
    assert ref() is None  # its lane holds neither it nor a call's traceback
