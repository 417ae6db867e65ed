"""The store's keys checked at the door, one thread's call at a time, and a bad out caught before a push."""

import threading

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import KeyMismatchError, KVStoreError
from collectives.kvstore import KVStore
from tests.test_kvstore import run_store


@pytest.mark.parametrize("key", [None, "", True, 1.5, b"k"])
def test_a_key_that_is_not_an_int_or_a_non_empty_str_is_refused_and_the_store_goes_on(key: object) -> None:
    def body(kv: KVStore, comm: Communicator) -> float:
        for call in (
            lambda: kv.init(key, np.zeros(3)),
            lambda: kv.push(key, np.zeros(3)),
            lambda: kv.pull(key),
        ):
            with pytest.raises(KVStoreError, match=r"a key is an int or a non-empty str, got \w+"):
                call()
        with pytest.raises(KVStoreError, match="a key is"):
            kv.init(["w", key], [np.zeros(3), np.zeros(3)])  # refused whole: "w" was not made
        kv.init("w", np.zeros(3))  # the server thread still serves
        return float(kv.pushpull("w", np.ones(3))[0])

    assert run_store(2, body) == [2.0, 2.0]


def test_workers_pushpulling_another_key_are_named_not_left_to_time_out() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        kv.init(3, np.zeros(4))
        kv.init("3", np.zeros(4))
        try:
            kv.pushpull(3 if kv.rank == 0 else "3", np.ones(4))
        except KeyMismatchError as error:
            return str(error)
        return "no error"

    messages = run_store(2, body, timeout=30.0)
    assert "pushpull of key 3 (int) on rank 0: workers [1] pushpulled another key" in messages[0]
    assert "(of type str)" in messages[0]
    assert "pushpull of key '3' (str) on rank 1: workers [0]" in messages[1]
    assert "(of type int)" in messages[1]


def test_an_async_pushpull_with_a_bad_out_sends_nothing() -> None:
    def body(kv: KVStore, comm: Communicator) -> float:
        kv.init("w", np.zeros(4))
        with pytest.raises(KeyMismatchError, match=r"out for key 'w' on rank \d is float64\[5\]"):
            kv.pushpull("w", np.ones(4), out=np.zeros(5))
        kv.barrier()
        return float(kv.pull("w")[0])

    assert run_store(2, body, mode="async") == [0.0, 0.0]  # the push was not applied


def test_a_second_threads_call_on_a_store_is_refused_naming_both_threads() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        kv.init("w", np.zeros(4))
        taken, done = threading.Event(), threading.Event()

        def hold() -> None:  # a call of another thread, running
            kv.claim.owner = kv.claim.held[0] = threading.get_ident()
            taken.set()
            done.wait(10)
            kv.claim.owner = 0
            del kv.claim.held[0]

        holder = threading.Thread(target=hold, name=f"holder-{kv.rank}")
        holder.start()
        taken.wait(10)
        try:
            kv.push("w", np.ones(4))
            message = "no error"
        except KVStoreError as error:
            message = str(error)
        done.set()
        holder.join()
        kv.pushpull("w", np.ones(4))  # the store is usable once the other call ends
        return message

    for rank, message in enumerate(run_store(2, body)):
        assert f"called push on a store while thread 'holder-{rank}'" in message, message
