"""A ``sync`` pushpull repeated on one key runs by its kept plan: lean, the same bits, misorders named."""

import sys
import time
from types import FrameType
from typing import Any

import numpy as np
import pytest

from collectives import Communicator, api
from collectives.errors import KeyMismatchError, KVStoreError
from collectives.kvstore import SGD, KVStore
from tests.test_kvstore import run_store
from tests.test_kvstore_collective import STORE_DTYPES, _value

_COLLECTIVES = {api.allreduce.__code__, api.reduce_scatter.__code__, api.allgather.__code__}


def _calls_beside_the_collectives(call: Any) -> int:
    """Python and C function calls ``call()`` makes outside the api's collectives (each entry counts one)."""
    state = {"depth": 0, "calls": 0}

    def count(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code in _COLLECTIVES:
            state["depth"] += 1
            state["calls"] += 1
        elif event == "return" and frame.f_code in _COLLECTIVES:
            state["depth"] -= 1
        elif event in ("call", "c_call") and not state["depth"]:
            state["calls"] += 1

    sys.setprofile(count)
    try:
        call()
    finally:
        sys.setprofile(None)
    return state["calls"]


@pytest.mark.parametrize("given", [True, False])
def test_a_repeated_pushpull_is_its_allreduce_and_a_few_calls_more(given: bool) -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[int, int]:
        kv.init("w", np.zeros(1024, np.float32))
        value, out = np.ones(1024, np.float32), np.empty(1024, np.float32)
        for _ in range(3):
            kv.pushpull("w", value, out=out if given else None)
        before = comm.watchdog.sequence
        calls = _calls_beside_the_collectives(lambda: kv.pushpull("w", value, out=out if given else None))
        return calls, comm.watchdog.sequence - before

    for calls, collectives in run_store(2, body, mode="sync"):
        assert collectives == 1
        # the door, the plan's checks, the allreduce and the server's assignment; 86-97 before plans
        assert calls <= 20, calls


@pytest.mark.parametrize("dtype", STORE_DTYPES)
def test_repeated_pushpulls_equal_the_message_path_bitwise(dtype: str) -> None:
    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init(["a", 7], [np.zeros((5, 3), dtype), np.zeros(11, dtype)])
        seen = []
        for t in range(4):
            out = np.empty((5, 3), dtype)
            got = kv.pushpull("a", _value(kv.rank, t, (5, 3), dtype), out=out if t % 2 else None)
            assert got is out or not t % 2
            seen += [got.tobytes(), kv.pushpull(7, _value(kv.rank, t + 1, (11,), dtype)).tobytes()]
            seen.append(kv.pull("a").tobytes())  # the servers hold each round's aggregate
        return seen

    fast = run_store(3, body, mode="sync", partition_bytes=16)  # "a" over the three servers
    assert fast == run_store(3, body, mode="sync", partition_bytes=16, collective=False)
    total = sum(_value(r, 4, (11,), dtype).astype(np.int64) for r in range(3))  # 7's last round
    assert np.array_equal(np.frombuffer(fast[0][-2], dtype).astype(np.int64), total)


def test_a_worker_out_of_order_in_repeated_pushpulls_is_named_on_every_worker() -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[str, float, list[float]]:
        kv.init([3, "w"], [np.zeros(4), np.zeros(4)])
        for key in (3, "w", 3, "w"):  # both keys planned, of the same shape and dtype
            kv.pushpull(key, np.ones(4))
        start = time.monotonic()
        try:
            kv.pushpull(3 if kv.rank != 1 else "w", np.ones(4))
            message = "no error"
        except KeyMismatchError as error:
            message = str(error)
        took = time.monotonic() - start
        return message, took, kv.pushpull(3, np.full(4, 2.0)).tolist()  # the store goes on in order

    results = run_store(3, body, mode="sync", timeout=30.0)
    messages = [m for m, _, _ in results]
    assert (
        "pushpull of key 3 (int) on rank 0: workers [1] pushpulled another key (of type str)" in messages[0]
    )
    assert "pushpull of key 3 (int) on rank 2: workers [1] pushpulled another key" in messages[2]
    assert "pushpull of key 'w' (str) on rank 1: workers [0, 2] pushpulled another key" in messages[1]
    assert all(took < 10.0 for _, took, _ in results)  # at the signature exchange, not the timeout
    assert all(after == [6.0] * 4 for _, _, after in results)


def test_a_kept_plan_gives_way_to_an_updater_and_an_optimizer() -> None:
    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init("w", np.ones(12))
        seen = [kv.pushpull("w", _value(kv.rank, t, (12,), "float64")).tobytes() for t in range(2)]
        kv.set_updater(lambda key, received, stored: stored * 0.5 + received)
        seen += [kv.pushpull("w", _value(kv.rank, t, (12,), "float64")).tobytes() for t in range(2)]
        kv.set_optimizer(SGD(lr=0.25, momentum=0.5))
        seen += [kv.pushpull("w", _value(kv.rank, t, (12,), "float64")).tobytes() for t in range(2)]
        return seen

    fast = run_store(2, body, mode="sync")
    slow = run_store(2, body, mode="sync", collective=False)
    assert fast == slow
    assert len({tuple(f) for f in fast}) == 1


def test_bad_values_after_a_plan_are_refused_as_before() -> None:
    def body(kv: KVStore, comm: Communicator) -> list[str]:
        kv.init([1, "m"], [np.zeros(6), np.zeros((2, 3), np.float32)])
        kv.pushpull(1, np.ones(6))
        kv.pushpull("m", np.ones((2, 3), np.float32))
        errors = []
        for bad in (
            lambda: kv.pushpull(1, np.ones(5)),
            lambda: kv.pushpull(1, np.ones(6, np.float32)),
            lambda: kv.pushpull(1, np.ones(6), out=np.empty(6, np.float32)),
            lambda: kv.pushpull(1, np.ones(6), out=np.empty(12)[::2]),
            lambda: kv.pushpull("m", np.ones(6, np.float32)),
            lambda: kv.pushpull(True, np.ones(6)),
            lambda: kv.pushpull(1.0, np.ones(6)),
        ):
            try:
                bad()
                errors.append("no error")
            except KVStoreError as error:
                errors.append(f"{type(error).__name__}: {error}")
        # what the general path converts still runs: a list, and a value that is not contiguous
        listed = kv.pushpull(1, [1.0] * 6)
        strided = kv.pushpull("m", np.ones((2, 6), np.float32)[:, ::2])
        assert listed.tolist() == [2.0] * 6 and strided.tolist() == [[2.0] * 3] * 2
        return errors

    for errors in run_store(2, body, mode="sync"):
        assert errors[0].startswith("KeyMismatchError: value for key 1 on rank"), errors[0]
        assert "is float64[5]; the key is float64[6]" in errors[0]
        assert "is float32[6]; the key is float64[6]" in errors[1]
        assert errors[2].startswith("KeyMismatchError: out for key 1") and "float32[6]" in errors[2]
        assert "out for key 1 on rank" in errors[3] and "not C-contiguous" in errors[3]
        assert "value for key 'm'" in errors[4] and "the key is float32[2, 3]" in errors[4]
        assert errors[5].startswith("KVStoreError: a key is an int or a non-empty str, got bool True")
        assert errors[6].startswith("KVStoreError: a key is an int or a non-empty str, got float 1.0")


def test_a_repeated_push_is_its_allreduce_and_a_few_calls_more() -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[int, int, list[float]]:
        kv.init("w", np.zeros((32, 32), np.float32))
        value = np.ones((32, 32), np.float32)
        for _ in range(3):
            kv.push("w", value)
            kv.pull("w")
        before = comm.watchdog.sequence
        calls = _calls_beside_the_collectives(lambda: kv.push("w", value))
        pushed = comm.watchdog.sequence - before
        return calls, pushed, kv.pull("w").ravel()[:3].tolist()  # the push's result, at hand

    for calls, collectives, pulled in run_store(2, body, mode="sync"):
        assert collectives == 1
        assert calls <= 24, calls  # 152 before the push had a plan
        assert pulled == [2.0] * 3


@pytest.mark.parametrize("dtype", STORE_DTYPES)
def test_repeated_pushes_and_pulls_equal_the_message_path_bitwise(dtype: str) -> None:
    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init(["a", 7], [np.zeros((5, 3), dtype), np.zeros(11, dtype)])
        seen = []
        for t in range(4):
            kv.push("a", _value(kv.rank, t, (5, 3), dtype))
            kv.push(7, _value(kv.rank, t + 1, (11,), dtype))
            out = np.empty((5, 3), dtype)
            seen += [kv.pull("a", out=out if t % 2 else None).tobytes(), kv.pull(7).tobytes()]
            seen.append(kv.pushpull("a", _value(kv.rank, t + 2, (5, 3), dtype)).tobytes())
        return seen

    fast = run_store(3, body, mode="sync", partition_bytes=16)
    assert fast == run_store(3, body, mode="sync", partition_bytes=16, collective=False)


def test_a_worker_pushing_another_key_on_the_plan_is_named_on_every_worker() -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[str, list[float]]:
        kv.init([3, "w"], [np.zeros(4), np.zeros(4)])
        for key in (3, "w", 3, "w"):  # both keys planned, of the same shape and dtype
            kv.push(key, np.ones(4))
            kv.pull(key)
        try:
            kv.push(3 if kv.rank != 1 else "w", np.ones(4))
            message = "no error"
        except KeyMismatchError as error:
            message = str(error)
        kv.push(3, np.full(4, 2.0))  # the store goes on in order
        return message, kv.pull(3).tolist()

    results = run_store(3, body, mode="sync", timeout=30.0)
    assert "push of key 3 (int) on rank 0: workers [1] pushed another key" in results[0][0], results
    assert "push of key 'w' (str) on rank 1: workers [0, 2] pushed another key" in results[1][0], results
    assert all(after == [6.0] * 4 for _, after in results)
