"""On loopback: repeated allreduce calls reuse their decisions; small ones send data with the signature."""

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives
from collectives import CollectiveTimeout, Communicator, InvalidBufferError, MismatchError
from collectives.transport.loopback import LoopbackWorld
from collectives.transport.tags import Tag
from collectives.watchdog import FUSED_BYTES

Ranks = Callable[..., list[Any]]


def _counting(
    world_size: int, fn: Callable[[Communicator], Any], **settings: Any
) -> tuple[list[Any], list[int]]:
    """``fn(comm)`` on every rank (its result or the error it raised), and the tag of every message sent."""
    world = LoopbackWorld(world_size, timeout=30)
    tags: list[int] = []
    lock = threading.Lock()

    def body(transport: Any) -> Any:
        send = transport.isend

        def counting(buffer: Any, dst: int, tag: int) -> Any:
            with lock:
                tags.append(tag)
            return send(buffer, dst, tag)

        transport.isend = counting
        try:
            return fn(Communicator(transport, **settings))
        except Exception as error:
            return error

    return world.run(body), tags


@pytest.mark.parametrize("algorithm", ["butterfly", "ring", "direct", "auto"])
@pytest.mark.parametrize("result", ["in place", "new", "out"])
def test_repeated_calls_give_exact_sums(ranks: Ranks, algorithm: str, result: str) -> None:
    def call(comm: Communicator) -> list[np.ndarray]:
        results = []
        for i in range(4):
            x = np.arange(10, dtype=np.int64) * (comm.rank + 1) + i
            out = {"in place": x, "new": None, "out": np.empty_like(x)}[result]
            got = collectives.allreduce(x, out=out, algorithm=algorithm, comm=comm)
            assert out is None or got is out
            results.append(got)
        return results

    for size in (2, 3, 4):
        expected = [np.arange(10) * sum(range(1, size + 1)) + i * size for i in range(4)]
        for got in ranks(size, call):
            assert all(np.array_equal(g, e) for g, e in zip(got, expected, strict=True))


def test_a_small_call_sends_one_message_per_peer_and_a_large_one_its_data_apart() -> None:
    def call(comm: Communicator) -> Any:
        collectives.allreduce(np.ones(8, np.float32), algorithm="butterfly", comm=comm)
        return collectives.allreduce(
            np.ones(FUSED_BYTES // 4 + 1, np.float32), algorithm="butterfly", comm=comm
        )

    results, tags = _counting(2, call)
    assert all((r == 2).all() for r in results)
    # 2 ranks x (small: the signature with the data; large: the signature, then the data)
    assert tags.count(Tag.SIGNATURE) == 4 and tags.count(Tag.DATA) == 2


@pytest.mark.parametrize(
    ("second", "field"),
    [
        (lambda c: np.ones(4 + c.rank, np.float32), "count"),
        (lambda c: np.ones(4, np.float32 if c.rank else np.float64), "dtype"),
    ],
)
def test_a_mismatch_after_repeated_calls_raises_on_every_rank(second: Any, field: str) -> None:
    def call(comm: Communicator) -> Any:
        for _ in range(3):
            x = np.ones(4, np.float32)
            collectives.allreduce(x, out=x, comm=comm)
        with pytest.raises(MismatchError) as caught:
            x = second(comm)
            collectives.allreduce(x, out=x, comm=comm)
        after = np.ones(4, np.float32)
        collectives.allreduce(after, out=after, comm=comm)  # the communicator still works
        return caught.value, after

    results, _ = _counting(2, call)
    for error, after in results:
        assert list(error.fields) == [field] and (after == 2).all()


def test_ranks_on_a_repeated_and_a_first_call_of_one_signature_agree(ranks: Ranks) -> None:
    # rank 0 has seen the call in place before, rank 1 not out of place: both send the data alike
    def call(comm: Communicator) -> Any:
        x = np.ones(6, np.int32)
        collectives.allreduce(x, out=x, comm=comm)
        y = np.full(6, comm.rank + 1, np.int32)
        return collectives.allreduce(y, out=y if comm.rank == 0 else None, comm=comm)

    assert all((r == 3).all() for r in ranks(2, call))


def test_a_repeated_call_still_checks_its_arrays(ranks: Ranks) -> None:
    def call(comm: Communicator) -> Any:
        x = np.arange(12, dtype=np.float64).reshape(3, 4)
        collectives.allreduce(x.copy(), out=None, comm=comm)
        strided = np.arange(24, dtype=np.float64).reshape(3, 8)[:, ::2]  # same key, not contiguous
        got = collectives.allreduce(strided, comm=comm)
        frozen = x.copy()
        frozen.flags.writeable = False
        collectives.allreduce(x, out=x, comm=comm)
        with pytest.raises(InvalidBufferError, match="read-only"):
            collectives.allreduce(frozen, out=frozen, comm=comm)
        out = np.empty_like(x)
        collectives.allreduce(x, out=out, comm=comm)
        with pytest.raises(InvalidBufferError, match="read-only"):
            collectives.allreduce(x, out=frozen, comm=comm)
        with pytest.raises(InvalidBufferError, match="shape"):
            collectives.allreduce(x, out=out.reshape(4, 3), comm=comm)
        overlapping = np.arange(12, dtype=np.float64).reshape(3, 4)
        collectives.allreduce(
            overlapping, out=overlapping.reshape(3, 4), comm=comm
        )  # a view of x: reads first
        assert np.array_equal(overlapping, 2 * np.arange(12).reshape(3, 4))
        return got, strided

    for got, strided in ranks(2, call):
        assert np.array_equal(got, 2 * strided)


def test_a_missing_rank_still_times_out_on_a_repeated_call() -> None:
    def call(comm: Communicator) -> Any:
        x = np.ones(4, np.float32)
        collectives.allreduce(x, out=x, comm=comm)
        if comm.rank == 1:
            return None
        collectives.allreduce(x, out=x, comm=comm)

    started = time.monotonic()
    results, _ = _counting(2, call, timeout=0.3)
    assert time.monotonic() - started < 10
    error = results[0]
    assert isinstance(error, CollectiveTimeout) and (error.step, error.peers) == ("signature", (1,))
    assert "allreduce #1 timed out after" in str(error)
