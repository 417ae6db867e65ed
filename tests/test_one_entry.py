"""Every collective of the API goes through one entry, dispatch.call_collective; repeats reuse decisions."""

import time
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import api, dispatch
from collectives.communicator import Communicator

from .conftest import run_ranks

WORLD = 2


def _every_collective(comm: Communicator) -> None:
    """Each blocking collective once, and each non-blocking one, on small arrays."""
    p = comm.size
    x = np.arange(2 * p, dtype=np.float32)
    C.allreduce(x, comm=comm)
    C.allreduce(x.astype(np.float16), "avg", comm=comm)  # widened, then the one entry
    C.reduce_scatter(x, comm=comm)
    C.allgather(x[:2], comm=comm)
    C.broadcast(x, comm=comm)
    C.reduce(x, comm=comm)
    C.gather(x[:2], comm=comm)
    C.scatter(x, comm=comm)
    C.alltoall(x, comm=comm)
    C.barrier(comm)
    C.iallreduce(x, comm=comm).wait()
    C.ibarrier(comm).wait()


def test_every_collective_goes_through_the_one_entry(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[int, str]] = []
    call_collective = dispatch.call_collective

    def counted(comm: Any, collective: str, **arguments: Any) -> Any:
        seen.append((comm.rank, collective))
        return call_collective(comm, collective, **arguments)

    monkeypatch.setattr(api, "call_collective", counted)
    run_ranks(WORLD, _every_collective)
    expected = [
        "allreduce", "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce", "gather", "scatter",
        "alltoall", "barrier", "allreduce", "barrier",
    ]  # fmt: skip
    for rank in range(WORLD):
        assert [c for r, c in seen if r == rank] == expected


def test_a_repeated_call_reuses_its_first_calls_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    def run(comm: Communicator) -> tuple[int, list[float]]:
        x = np.arange(4, dtype=np.float64)
        results = [C.allreduce(x, comm=comm) for _ in range(3)]
        return len(comm.repeats), [float(r.sum()) for r in results]

    for kept, sums in run_ranks(WORLD, run):
        assert kept == 1  # one key, its decisions kept by the first call and reused
        assert sums == [12.0] * 3


def test_a_widened_call_waits_for_the_started_calls_first() -> None:
    """A float16 average reads x only once the started call writing x is done, as every call does."""

    def run(comm: Communicator) -> list[float]:
        x = np.ones(3, np.float16)
        if comm.rank == 1:
            time.sleep(0.3)  # rank 0's started call cannot finish before this rank starts its own
        request = C.iallreduce(x, out=x, comm=comm)
        y = C.allreduce(x, "avg", comm=comm)  # of the sums, 2 on every rank
        request.wait()
        return [float(v) for v in y]

    assert run_ranks(WORLD, run) == [[2.0] * 3] * WORLD


def test_the_repeat_room_is_asked_once_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[tuple[int, str]] = []
    find_repeat = dispatch.find_repeat

    def counted(group: Communicator, collective: str, *args: Any) -> Any:
        asked.append((group.rank, collective))
        return find_repeat(group, collective, *args)

    monkeypatch.setattr(dispatch, "find_repeat", counted)

    def run(comm: Communicator) -> None:
        x = np.arange(2 * comm.size, dtype=np.float32)
        for _ in range(3):  # a first call, then two repeats of it
            C.allreduce(x, comm=comm)
            C.reduce_scatter(x, comm=comm)
            C.allgather(x, comm=comm)
        C.broadcast(x, comm=comm)

    run_ranks(WORLD, run)
    expected = ["allreduce", "reduce_scatter", "allgather"] * 3 + ["broadcast"]
    for rank in range(WORLD):
        assert [c for r, c in asked if r == rank] == expected
