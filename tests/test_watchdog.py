"""On loopback: mismatched calls raise on every rank, no wait is unbounded, and every call is recorded."""

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives
from collectives import CollectiveTimeout, Communicator, MismatchError, TransportError
from collectives.errors import ConfigurationError
from collectives.transport.loopback import LoopbackWorld

Ranks = Callable[..., list[Any]]


def _on_every_rank(world_size: int, fn: Callable[[Communicator], Any], **settings: Any) -> list[Any]:
    """``fn(comm)`` on every rank of a loopback world, with the exception each rank raised, if any."""
    world = LoopbackWorld(world_size, timeout=30)

    def body(transport: Any) -> Any:
        try:
            return fn(Communicator(transport, **settings))
        except Exception as error:
            return error

    return world.run(body)


def test_a_count_that_differs_raises_on_every_rank_naming_the_ranks() -> None:
    def call(comm: Communicator) -> Any:
        return collectives.allreduce(np.ones(4 if comm.rank != 1 else 5, np.float32), comm=comm)

    errors = _on_every_rank(3, call)
    assert all(isinstance(e, MismatchError) for e in errors), errors
    assert all(e.fields == {"count": {"4": (0, 2), "5": (1,)}} for e in errors)
    assert "allreduce #0" in str(errors[0])
    assert "count: 4 on ranks 0, 2; 5 on rank 1" in str(errors[0])


@pytest.mark.parametrize(
    ("call", "field", "values"),
    [
        (lambda c, x: collectives.allreduce(x.astype("f8" if c.rank else "f4"), comm=c), "dtype",
         {"float32": (0,), "float64": (1,)}),
        (lambda c, x: collectives.allreduce(x, "max" if c.rank else "sum", comm=c), "op",
         {"sum": (0,), "max": (1,)}),
        (lambda c, x: collectives.broadcast(x, root=c.rank, comm=c), "root", {"0": (0,), "1": (1,)}),
        (lambda c, x: collectives.allreduce(x, algorithm="tree" if c.rank else "ring", comm=c), "algorithm",
         {"ring": (0,), "tree": (1,)}),
        (lambda c, x: collectives.allreduce(x, algorithm="auto" if c.rank else "ring", comm=c), "algorithm",
         {"ring": (0,), "auto": (1,)}),
        (lambda c, x: collectives.reduce_scatter(x, counts=[c.rank, 4 - c.rank], comm=c), "counts", None),
    ],
)  # fmt: skip
def test_each_field_of_the_signature_is_checked(call: Any, field: str, values: Any) -> None:
    errors = _on_every_rank(2, lambda comm: call(comm, np.arange(4, dtype=np.float32)))
    assert all(isinstance(e, MismatchError) and list(e.fields) == [field] for e in errors), errors
    if values is not None:
        assert errors[0].fields[field] == values
    else:
        assert "rank 0 passed counts=(0, 4)" in str(errors[0])


def test_different_collectives_are_named() -> None:
    def call(comm: Communicator) -> Any:
        x = np.ones(3, np.int32)
        if comm.rank == 0:
            collectives.allreduce(x, comm=comm)
        return collectives.broadcast(x, comm=comm)

    errors = _on_every_rank(2, call)
    assert all(isinstance(e, MismatchError) for e in errors), errors
    assert errors[0].fields == {
        "collective": {"allreduce": (0,), "broadcast": (1,)},
        "op": {"sum": (0,), "none": (1,)},
        "root": {"none": (0,), "0": (1,)},
    }


def test_a_call_made_on_one_rank_only_shows_in_the_sequence_number() -> None:
    def call(comm: Communicator) -> Any:
        x = np.ones(3, np.int32)
        if comm.rank == 0:
            # unchecked, and empty so it sends nothing, but still numbered
            collectives.allreduce(x[:0], comm=comm, check=False)
        return collectives.broadcast(x, comm=comm)

    errors = _on_every_rank(2, call)
    assert all(isinstance(e, MismatchError) for e in errors), errors
    assert errors[1].fields == {"sequence": {"1": (0,), "0": (1,)}}
    assert "broadcast #0" in str(errors[1]) and "sequence: 1 on rank 0; 0 on rank 1" in str(errors[1])


def test_unequal_shares_with_equal_counts_pass_the_check(ranks: Ranks) -> None:
    counts = [1, 0, 4]
    results = ranks(
        3, lambda c: collectives.allgather(np.full(counts[c.rank], c.rank, np.int16), counts=counts, comm=c)
    )
    assert all((r == np.repeat(np.arange(3), counts)).all() for r in results)


def test_after_a_mismatch_the_communicator_still_works() -> None:
    def call(comm: Communicator) -> Any:
        with pytest.raises(MismatchError):
            collectives.allreduce(np.ones(2 + comm.rank), comm=comm)
        return collectives.allreduce(np.ones(2), comm=comm)

    assert all((r == 2).all() for r in _on_every_rank(2, call))


def test_a_missing_rank_times_out_naming_the_collective_step_and_peers() -> None:
    def call(comm: Communicator) -> Any:
        if comm.rank == 2:
            return None  # never joins
        return collectives.allreduce(np.ones(8), comm=comm)

    started = time.monotonic()
    errors = _on_every_rank(3, call, timeout=0.3)
    assert time.monotonic() - started < 10
    for rank in (0, 1):
        error = errors[rank]
        assert isinstance(error, CollectiveTimeout), error
        assert (error.collective, error.sequence, error.step, error.peers) == (
            "allreduce",
            0,
            "signature",
            (2,),
        )
        assert f"rank {rank}: allreduce #0 timed out after 0.3 s" in str(error)
        assert "waiting for rank 2; this communicator is unusable now" in str(error)
        assert f"collectives rank {rank} #0 allreduce count=8 dtype=float64" in str(error)  # the recorder


def test_a_timeout_in_a_step_names_the_step_and_breaks_the_communicator() -> None:
    def call(comm: Communicator) -> Any:
        if comm.rank == 1:
            return None
        with pytest.raises(CollectiveTimeout) as caught:
            collectives.allreduce(np.ones(8), algorithm="ring", comm=comm, check=False)
        with pytest.raises(TransportError, match="unusable"):
            collectives.barrier(comm)
        return caught.value

    error = _on_every_rank(2, call, timeout=0.2)[0]
    assert (error.step, error.peers) == (0, (1,))
    assert "stuck in step 0 waiting for rank 1" in str(error)


def test_a_late_rank_is_named_in_a_stall_warning(caplog: pytest.LogCaptureFixture) -> None:
    def call(comm: Communicator) -> Any:
        if comm.rank == 1:
            time.sleep(0.5)
        return collectives.allreduce(np.ones(8), comm=comm)

    with caplog.at_level(logging.WARNING, logger="collectives"):
        results = _on_every_rank(2, call, timeout=20, stall_warning=0.1)
    assert all((r == 2).all() for r in results)
    assert any("rank 0: allreduce #0 has waited" in m and "to start for rank 1" in m for m in caplog.messages)


def test_the_flight_recorder_keeps_the_last_calls(ranks: Ranks, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLLECTIVES_FLIGHT_RECORDER", "3")

    def call(comm: Communicator) -> list[str]:
        for count in range(5):
            collectives.allreduce(np.ones(count, np.int64), "max", comm=comm)
        return comm.flight_record()

    lines = ranks(2, call)[1]
    assert [line.split()[3:5] for line in lines] == [
        ["#2", "allreduce"],
        ["#3", "allreduce"],
        ["#4", "allreduce"],
    ]
    assert "count=4 dtype=int64 op=max root=-" in lines[-1] and lines[-1].endswith(" ok")


def test_debug_logs_one_line_per_call_to_a_file_per_rank(
    ranks: Ranks, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("COLLECTIVES_DEBUG", "1")
    monkeypatch.setenv("COLLECTIVES_DEBUG_FILE", str(tmp_path / "rank{rank}.log"))
    ranks(2, lambda c: (collectives.broadcast(np.ones(3), root=1, comm=c), collectives.barrier(c)))
    for rank in (0, 1):
        lines = (tmp_path / f"rank{rank}.log").read_text().splitlines()
        assert [line.split()[3:5] for line in lines] == [["#0", "broadcast"], ["#1", "barrier"]]
        assert "root=1" in lines[0] and "algorithm=" in lines[0] and "time=" in lines[0]


def test_debug_logs_to_stderr(
    ranks: Ranks, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLLECTIVES_DEBUG", "1")
    ranks(1, lambda c: collectives.allreduce(np.ones(3), algorithm="ring", comm=c))
    assert "collectives rank 0 #0 allreduce count=3 dtype=float64 op=sum root=- algorithm=ring" in (
        capsys.readouterr().err
    )


def test_settings_come_from_arguments_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    transport = LoopbackWorld(1).transport(0)
    assert Communicator(transport).timeout == 1800
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "5")
    assert Communicator(transport).timeout == 5
    assert Communicator(transport, timeout=0).timeout == math.inf
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "soon")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_TIMEOUT='soon' is not a number of seconds"):
        Communicator(transport)
    monkeypatch.setenv("COLLECTIVES_TIMEOUT", "0")
    monkeypatch.setenv("COLLECTIVES_CHECK", "maybe")
    with pytest.raises(ConfigurationError, match="COLLECTIVES_CHECK='maybe' is neither 1 nor 0"):
        Communicator(transport)
    with pytest.raises(ConfigurationError, match="non-negative"):
        Communicator(transport, timeout=-1, check=True)


def test_check_off_by_environment_sends_no_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    # COLLECTIVES_CHECK=0: no message on the signature tag (9), only the schedule's
    monkeypatch.setenv("COLLECTIVES_CHECK", "0")
    sent: list[int] = []
    world = LoopbackWorld(2, timeout=5)
    lock = threading.Lock()

    def body(transport: Any) -> Any:
        send = transport.isend

        def counting(buffer: Any, dst: int, tag: int) -> Any:
            with lock:
                sent.append(tag)
            return send(buffer, dst, tag)

        transport.isend = counting
        return collectives.allreduce(np.ones(4), comm=Communicator(transport))

    world.run(body)
    assert sent and 9 not in sent
