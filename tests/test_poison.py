"""On loopback: a call whose checks fail on one rank fails on every rank at once, and the next call runs."""

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives
from collectives import (
    CollectiveTimeout,
    Communicator,
    InvalidBufferError,
    InvalidRootError,
    MismatchError,
    PeerInputError,
    UnknownAlgorithmError,
    UnsupportedDtypeError,
    UnsupportedOpError,
    backends,
)
from collectives.signature import PROBLEM_BYTES, SIGNATURE_BYTES, Signature, disagreement, problem_of
from collectives.transport.loopback import LoopbackWorld
from tests.fake_device import DeviceArray, FakeDeviceBackend

BAD = 1
"""The rank whose call is bad."""

TIMEOUT_S = 20.0
"""The communicators' timeout: a regression shows as CollectiveTimeout after this, not a quick error."""


def _on_every_rank(world_size: int, fn: Callable[[Communicator], Any], **settings: Any) -> list[Any]:
    """``fn(comm)`` on every rank of a loopback world: what each returned, or the exception it raised."""
    world = LoopbackWorld(world_size, timeout=2 * TIMEOUT_S)
    settings.setdefault("timeout", TIMEOUT_S)

    def body(transport: Any) -> Any:
        try:
            return fn(Communicator(transport, **settings))
        except Exception as error:
            return error

    return world.run(body)


def _x(rank: int, rows: int = 6) -> np.ndarray:
    return np.arange(rows * 2, dtype=np.float32).reshape(rows, 2) + rank


def _read_only(x: np.ndarray) -> np.ndarray:
    x.flags.writeable = False
    return x


# (collective, call on a good rank, call on the bad rank, the bad rank's error, words of its message)
CASES: list[
    tuple[
        str, Callable[[Communicator, np.ndarray], Any], Callable[[Communicator, np.ndarray], Any], type, str
    ]
]
CASES = [
    ("allreduce", lambda c, x: collectives.allreduce(x, out=np.empty_like(x), comm=c),
     lambda c, x: collectives.allreduce(x, out=np.empty((5, 2), x.dtype), comm=c),
     InvalidBufferError, "out has shape (5, 2), expected (6, 2)"),
    ("allreduce", lambda c, x: collectives.allreduce(x.astype(np.int32), "sum", comm=c),
     lambda c, x: collectives.allreduce(x.astype(np.int32), "avg", comm=c),
     UnsupportedOpError, "avg"),
    ("allreduce", lambda c, x: collectives.allreduce(x, out=x, comm=c),
     lambda c, x: collectives.allreduce(x, out=_read_only(x), comm=c),
     InvalidBufferError, "out is read-only"),
    ("allreduce", lambda c, x: collectives.allreduce(x, comm=c),
     lambda c, x: collectives.allreduce(x.tolist(), comm=c),
     UnsupportedDtypeError, "cannot communicate a builtins.list"),
    ("allreduce", lambda c, x: collectives.allreduce(x, algorithm="ring", comm=c),
     lambda c, x: collectives.allreduce(x, algorithm="rnig", comm=c),
     UnknownAlgorithmError, "rnig"),
    ("reduce_scatter", lambda c, x: collectives.reduce_scatter(x, out=x[: 6 // c.size].copy(), comm=c),
     lambda c, x: collectives.reduce_scatter(x, out=np.empty((5, 2), x.dtype), comm=c),
     InvalidBufferError, "out has shape (5, 2), expected"),
    ("allgather", lambda c, x: collectives.allgather(x, comm=c),
     lambda c, x: collectives.allgather(x, out=np.empty((18, 2), np.float64), comm=c),
     InvalidBufferError, "out has dtype float64, expected float32"),
    ("broadcast", lambda c, x: collectives.broadcast(x, root=0, comm=c),
     lambda c, x: collectives.broadcast(x, root=7, comm=c),
     InvalidRootError, "7"),
    ("reduce", lambda c, x: collectives.reduce(x, "max", root=0, comm=c),
     lambda c, x: collectives.reduce(x, "maximum", root=0, comm=c),
     UnsupportedOpError, "maximum"),
    ("gather", lambda c, x: collectives.gather(x, root=c.size - 1, comm=c),
     lambda c, x: collectives.gather(x, root=-1, comm=c),
     InvalidRootError, "-1"),
    ("scatter", lambda c, x: collectives.scatter(x, root=0, comm=c),
     lambda c, x: collectives.scatter(None, root=0, comm=c),
     InvalidBufferError, "scatter needs out= (or x) on rank 1"),
    ("alltoall", lambda c, x: collectives.alltoall(x, comm=c),
     lambda c, x: collectives.alltoall(x, out=np.empty(12, np.float32), comm=c),
     InvalidBufferError, "out has shape (12,), expected (6, 2)"),
    ("barrier", lambda c, x: collectives.barrier(c),
     lambda c, x: collectives.barrier(c, algorithm="ring"),
     UnknownAlgorithmError, "ring"),
]  # fmt: skip


@pytest.mark.parametrize(("collective", "good", "bad", "kind", "words"), CASES)
@pytest.mark.parametrize("world_size", [2, 3])
def test_a_bad_call_on_one_rank_fails_on_every_rank_and_the_next_call_runs(
    world_size: int, collective: str, good: Any, bad: Any, kind: type, words: str
) -> None:
    def call(comm: Communicator) -> Any:
        x = _x(comm.rank)
        started = time.monotonic()
        try:
            (bad if comm.rank == BAD else good)(comm, x)
            error: Exception | None = None
        except Exception as raised:
            error = raised
        took = time.monotonic() - started
        after = collectives.allreduce(np.full(3, comm.rank + 1, np.int64), comm=comm)
        return error, took, after, comm.flight_record()

    results = _on_every_rank(world_size, call)
    for rank, result in enumerate(results):
        assert not isinstance(result, Exception), f"rank {rank}: {result!r}"
        error, took, after, record = result
        assert took < TIMEOUT_S / 2, f"rank {rank} took {took:.1f} s"
        if rank == BAD:
            assert type(error) is kind, f"rank {rank}: {error!r}"
            assert words in str(error)
        else:
            assert isinstance(error, PeerInputError), f"rank {rank}: {error!r}"
            assert list(error.problems) == [BAD]
            assert error.problems[BAD].startswith(f"{kind.__name__}: ")
            assert f"{collective} #0: the call failed its checks on rank {BAD} ({kind.__name__}: " in str(
                error
            )
            assert list(error.fields) == ["problem"], error.fields
        # the sequence numbers stayed in step: the next call agreed and ran
        assert (after == sum(range(1, world_size + 1))).all()
        assert [line.split()[3] for line in record] == ["#0", "#1"]
        assert record[0].endswith(f"failed: {type(error).__name__}") and record[1].endswith(" ok")


def test_a_repeated_allreduce_that_turns_bad_on_one_rank_fails_on_every_rank() -> None:
    def call(comm: Communicator) -> Any:
        x = np.ones(4, np.float32)
        for _ in range(3):  # the later calls take the prepared fast path
            collectives.allreduce(x, out=x, comm=comm)
            x[:] = 1
        if comm.rank == BAD:
            x.flags.writeable = False
        with pytest.raises(InvalidBufferError if comm.rank == BAD else PeerInputError) as caught:
            collectives.allreduce(x, out=x, comm=comm)
        x.flags.writeable = True
        return caught.value, collectives.allreduce(x, out=x, comm=comm)

    for rank, (error, result) in enumerate(_on_every_rank(3, call)):
        assert ("out is read-only" in str(error)) if rank == BAD else (error.problems == {BAD: (
            "InvalidBufferError: out is read-only")})  # fmt: skip
        assert (result == 3).all()


def test_a_reproducible_call_whose_checks_fail_with_a_foreign_error_is_named_on_every_rank() -> None:
    def call(comm: Communicator) -> Any:
        counts = 5 if comm.rank == BAD else None  # not a sequence: int() of it raises TypeError, not ours
        with pytest.raises(TypeError if comm.rank == BAD else PeerInputError) as caught:
            collectives.reduce_scatter(np.ones(4, np.float32), counts=counts, reproducible=True, comm=comm)
        return caught.value

    errors = _on_every_rank(2, call)
    assert isinstance(errors[BAD], TypeError)
    # the others hear which rank refused and why, as for a plain call's checks
    assert errors[1 - BAD].problems == {BAD: "TypeError: 'int' object is not iterable"}


def test_several_bad_ranks_are_all_named_and_each_raises_its_own_error() -> None:
    def call(comm: Communicator) -> Any:
        x = np.ones(4, np.float32)
        if comm.rank == 1:
            return collectives.allreduce(x, "nope", comm=comm)
        if comm.rank == 2:
            return collectives.allreduce(x, out=np.empty(3, np.float32), comm=comm)
        return collectives.allreduce(x, comm=comm)

    errors = _on_every_rank(3, call)
    assert isinstance(errors[0], PeerInputError)
    assert set(errors[0].problems) == {1, 2}
    assert "on rank 1 (UnsupportedOpError: " in str(errors[0]) and "on rank 2 (InvalidBufferError: " in str(
        errors[0]
    )
    assert isinstance(errors[1], UnsupportedOpError) and isinstance(errors[2], InvalidBufferError)
    # each bad rank also hears of the other's error
    assert any("on rank 2 (InvalidBufferError" in note for note in errors[1].__notes__)


def test_the_same_bad_call_on_every_rank_raises_each_rank_s_own_error() -> None:
    def call(comm: Communicator) -> Any:
        with pytest.raises(InvalidRootError) as caught:
            collectives.broadcast(np.ones(3), root=5, comm=comm)
        assert not getattr(caught.value, "__notes__", None)
        return collectives.broadcast(np.full(3, comm.rank), root=1, comm=comm)

    assert all((r == 1).all() for r in _on_every_rank(3, call))


def test_with_checking_off_a_bad_call_on_one_rank_leaves_the_others_to_time_out() -> None:
    def call(comm: Communicator) -> Any:
        if comm.rank == BAD:
            with pytest.raises(UnsupportedOpError):
                collectives.allreduce(np.ones(3), "nope", comm=comm)
            return None
        return collectives.allreduce(np.ones(3), comm=comm)

    errors = _on_every_rank(2, call, timeout=0.3, check=False)
    assert isinstance(errors[0], CollectiveTimeout) and errors[BAD] is None


@pytest.fixture
def fake() -> Any:
    with backends.trying_first(FakeDeviceBackend()) as backend:
        yield backend


@pytest.mark.parametrize("collective", ["allreduce", "broadcast", "allgather"])
def test_device_and_host_arrays_in_one_call_are_a_mismatch(fake: FakeDeviceBackend, collective: str) -> None:
    # a named algorithm: a small "auto" allreduce of device arrays runs on a host copy (below)
    named = {"algorithm": "ring"} if collective == "allreduce" else {}

    def call(comm: Communicator) -> Any:
        x = _x(comm.rank)
        with pytest.raises(MismatchError) as caught:
            getattr(collectives, collective)(x.view(DeviceArray) if comm.rank == 0 else x, comm=comm, **named)
        return caught.value, collectives.allreduce(np.ones(2), comm=comm)

    for error, after in _on_every_rank(2, call):
        assert type(error) is MismatchError
        assert error.fields == {"backend": {"fake-device": (0,), "numpy": (1,)}}
        assert "backend: fake-device on rank 0; numpy on rank 1" in str(error)
        assert (after == 2).all()


def test_a_small_auto_allreduce_of_device_arrays_pairs_with_host_arrays(fake: FakeDeviceBackend) -> None:
    # it runs as a host allreduce on a copy, which another rank's host arrays meet as their own
    def call(comm: Communicator) -> Any:
        x = _x(comm.rank)
        return collectives.allreduce(x.view(DeviceArray) if comm.rank == 0 else x, comm=comm)

    results = _on_every_rank(2, call)
    assert isinstance(results[0], DeviceArray) and not isinstance(results[1], DeviceArray)
    for result in results:
        np.testing.assert_array_equal(result.view(np.ndarray), _x(0) + _x(1))


def test_a_poisoned_signature_fits_its_field_and_names_only_what_the_rank_knew() -> None:
    assert SIGNATURE_BYTES == 184
    problem = problem_of(InvalidBufferError("é" * PROBLEM_BYTES))
    assert len(problem.encode()) <= PROBLEM_BYTES and problem.startswith("InvalidBufferError: éé")
    good = Signature(4, "allreduce", "auto", "float32", "sum", count=8, backend="numpy")
    bad = Signature(4, "allreduce", "auto", problem=problem_of(UnsupportedOpError("op 'x' is unknown")))
    assert len(bad.pack()) == len(good.pack()) == SIGNATURE_BYTES
    error = disagreement(good, [good.pack(), bad.pack()], 0)
    assert isinstance(error, PeerInputError)
    assert error.problems == {1: "UnsupportedOpError: op 'x' is unknown"}
    assert error.fields == {"problem": {"none": (0,), "UnsupportedOpError: op 'x' is unknown": (1,)}}
    # a bad rank out of step is named as such too
    late = Signature(5, "allreduce", "auto", problem="InvalidRootError: root 3")
    error = disagreement(good, [good.pack(), late.pack()], 0)
    assert isinstance(error, PeerInputError) and error.fields["sequence"] == {"4": (0,), "5": (1,)}
    assert "| sequence: 4 on rank 0; 5 on rank 1" in str(error)
