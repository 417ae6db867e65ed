"""``sync`` push and pull as collectives: the message path's bits, one collective a round, named misorders."""

import time
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import KeyMismatchError, KVStoreTimeout, MismatchError
from collectives.kvstore import SGD, Adam, KVStore, collective
from collectives.ops import DTYPES
from collectives.signature import SIGNATURE_BYTES, Signature, disagreement, stamp_tag
from collectives.watchdog import PackedSignature
from tests.test_kvstore import run_store


def _known(name: str) -> bool:
    try:
        np.dtype(name)
    except TypeError:  # bfloat16 without ml_dtypes installed
        return False
    return True


STORE_DTYPES = [name for name in DTYPES if _known(name)]


def _value(rank: int, t: int, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Small integers: every sum is exact in any order and fits every dtype, int8 and uint8 included."""
    n = int(np.prod(shape))
    return ((np.arange(n) * (rank + 1) + 3 * t + rank) % 5).astype(dtype).reshape(shape)


def test_the_tag_travels_in_the_signature_and_is_named_where_it_differs() -> None:
    plain = Signature(3, "allreduce", "auto", "float32", "sum", count=8, backend="numpy")
    tagged = Signature(3, "allreduce", "auto", "float32", "sum", count=8, backend="numpy", tag=b"abcdefiP")
    assert len(tagged.pack()) == SIGNATURE_BYTES
    error = disagreement(plain, [plain.pack(), tagged.pack()], 0)
    assert isinstance(error, MismatchError)
    assert error.fields == {"tag": {"none": (0,), b"abcdefiP".hex(): (1,)}}
    # a guard kept for repeated calls takes each call's tag, and drops it again
    guard = PackedSignature(plain)
    guard.stamp(3, b"abcdefiP")
    assert bytes(guard.packed) == tagged.pack()
    guard.stamp(3)
    assert bytes(guard.packed) == plain.pack()
    packed = bytearray(plain.pack())
    stamp_tag(packed, b"abcdefiP")
    assert bytes(packed) == tagged.pack()


@pytest.mark.parametrize("whole", [True, False])
def test_a_sync_pushpull_is_one_collective_and_push_then_pull_no_more(
    whole: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not whole:  # a large value: a reduce-scatter, then an all-gather into out
        monkeypatch.setattr(collective, "WHOLE_BYTES", 0)

    def body(kv: KVStore, comm: Communicator) -> list[int]:
        kv.init("w", np.zeros(8))
        calls = []
        for step in (
            lambda: kv.pushpull("w", np.ones(8)),  # one allreduce: no round of its own to agree on the key
            lambda: kv.push("w", np.ones(8)),  # one allreduce, the result kept at hand
            lambda: kv.pull("w"),  # from the result at hand, or the all-gather of the updated runs
            lambda: kv.pull("w"),  # again: an all-gather of the servers' parts
        ):
            before = comm.watchdog.sequence
            step()
            calls.append(comm.watchdog.sequence - before)
        return calls

    assert run_store(3, body, mode="sync") == [[1, 1, 0 if whole else 1, 1]] * 3


@pytest.mark.parametrize("size", [1, 2, 3])
def test_a_large_push_and_pull_equal_the_message_path_bitwise(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(collective, "WHOLE_BYTES", 0)

    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init("w", np.zeros((7, 5), np.float32))
        seen = []
        for t in range(3):
            kv.push("w", _value(kv.rank, t, (7, 5), "float32"))
            seen += [kv.pull("w", out=np.empty((7, 5), np.float32)).tobytes(), kv.pull("w").tobytes()]
        return seen

    assert run_store(size, body, mode="sync") == run_store(size, body, mode="sync", collective=False)


@pytest.mark.parametrize("dtype", STORE_DTYPES)
@pytest.mark.parametrize("size", [1, 2, 3, 4])
def test_collective_push_and_pull_equal_the_message_path_bitwise(size: int, dtype: str) -> None:
    shape = (5, 3)

    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init(["a", 7], [np.zeros(shape, dtype), np.zeros(11, dtype)])
        seen = [kv.pull("a").tobytes()]  # before any push
        for t in range(3):
            kv.push(["a", 7], [_value(kv.rank, t, shape, dtype), _value(kv.rank, t, (11,), dtype)])
            out = np.empty(shape, dtype)
            handle = kv.pull(["a", 7], [out, None], block=False)
            a, b = handle.wait()
            assert a is out
            seen += [a.tobytes(), b.tobytes(), kv.pull(7).tobytes()]
        seen.append(kv.pushpull("a", _value(kv.rank, 9, shape, dtype)).tobytes())
        return seen

    fast = run_store(size, body, mode="sync")
    slow = run_store(size, body, mode="sync", collective=False)
    assert fast == slow
    assert len(set(map(tuple, fast))) == 1  # the same bits on every worker
    total = sum(_value(r, 2, (11,), dtype).astype(np.int64) for r in range(size))
    assert np.array_equal(np.frombuffer(fast[0][-2], dtype).astype(np.int64), total)


@pytest.mark.parametrize("optimizer", ["sgd", "adam", "updater"])
@pytest.mark.parametrize("size", [2, 3])
def test_server_updates_run_once_a_round_as_on_the_message_path(size: int, optimizer: str) -> None:
    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init(["w", "b"], [np.ones(40, np.float64), np.ones((2, 3), np.float32)])
        if optimizer == "updater":
            kv.set_updater(lambda key, received, stored: stored * 0.5 + received)
        else:
            kv.set_optimizer(SGD(lr=0.25, momentum=0.5) if optimizer == "sgd" else Adam(lr=0.125))
        seen = []
        for t in range(3):
            kv.push("w", _value(kv.rank, t, (40,), "float64"))
            kv.push("b", _value(kv.rank, t, (2, 3), "float32"))
            seen += [kv.pull("w").tobytes(), kv.pull("b").tobytes()]
            seen.append(kv.pushpull("w", _value(kv.rank, t + 5, (40,), "float64")).tobytes())
        return seen

    # 64-byte partitions: "w" spans every server in rank order, "b" (24 bytes) one server
    fast = run_store(size, body, mode="sync", partition_bytes=64)
    slow = run_store(size, body, mode="sync", partition_bytes=64, collective=False)
    assert fast == slow
    assert len(set(map(tuple, fast))) == 1


def test_partitions_out_of_rank_order_go_by_reduce_and_broadcast() -> None:
    # 3 servers, 2 partitions: the layout may put them out of rank order, whichever it picks the bits agree
    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init("w", np.zeros(16))
        kv.set_optimizer(SGD(lr=0.5))
        seen = []
        for t in range(3):
            kv.push("w", _value(kv.rank, t, (16,), "float64"))
            seen.append(kv.pull("w").tobytes())
        return seen

    for parts in (64, 80):
        assert run_store(3, body, mode="sync", partition_bytes=parts) == run_store(
            3, body, mode="sync", partition_bytes=parts, collective=False
        )


def _misorder(kv: KVStore, calls: Any) -> str:
    kv.init(3, np.zeros(4))
    kv.init("w", np.zeros(4))
    try:
        calls()
    except KeyMismatchError as error:
        return str(error)
    return "no error"


def test_a_worker_pushing_another_key_is_named_on_every_worker() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        return _misorder(kv, lambda: kv.push(3 if kv.rank != 1 else "w", np.ones(4)))

    messages = run_store(3, body, mode="sync", timeout=30.0)
    assert "push of key 3 (int) on rank 0: workers [1] pushed another key (of type str)" in messages[0]
    assert "push of key 3 (int) on rank 2: workers [1] pushed another key" in messages[2]
    assert "push of key 'w' (str) on rank 1: workers [0, 2] pushed another key (of type int)" in messages[1]


def test_a_worker_that_skips_its_push_is_named_on_every_worker() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        def calls() -> None:
            if kv.rank != 0:
                kv.push("w", np.ones(4))
            kv.pull("w")

        return _misorder(kv, calls)

    messages = run_store(2, body, mode="sync", timeout=30.0)
    assert "pull of key 'w' (str) on rank 0: workers [1] pushed it in the same round" in messages[0]
    assert "push of key 'w' (str) on rank 1: workers [0] pulled it in the same round" in messages[1]


def test_a_worker_that_never_pushes_is_named_within_the_timeout() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        kv.init("w", np.zeros(4))
        if kv.rank == 1:
            time.sleep(2.0)  # then closes: its server answers the others' close
            return "away"
        try:
            kv.push("w", np.ones(4))
        except KVStoreTimeout as error:
            assert error.workers == (1,), str(error)
            return str(error)
        return "no error"

    messages = run_store(2, body, mode="sync", timeout=1.0)
    assert "push of key 'w' on rank 0: workers [1] did not take part within the timeout" in messages[0]


def test_a_reported_pull_names_the_rounds_it_includes_as_the_messages_do() -> None:
    def body(kv: KVStore, comm: Communicator) -> list[tuple[int, ...]]:
        kv.init("w", np.zeros(40))
        seen = [kv.pull("w", report=True).included]
        for t in range(2):
            kv.push("w", np.full(40, float(t)))
            seen.append(kv.pull("w", report=True).included)
        return seen

    fast = run_store(2, body, mode="sync", partition_bytes=64)
    assert fast == run_store(2, body, mode="sync", partition_bytes=64, collective=False)
    assert fast[0] == [(0,) * 5, (1,) * 5, (2,) * 5]
