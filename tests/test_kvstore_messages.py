"""The store's messages: key mix-ups named, a handle's test under the store's claim, a dead server named."""

import re
import subprocess
import threading
import tracemalloc
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import KeyMismatchError, KVStoreError
from collectives.kvstore import KVStore
from collectives.kvstore._wire import QUIET, REQUEST_TAG, Kind, Refusal, compose, decode
from tests.mpirun import records
from tests.test_kvstore import run_store
from tests.ulfm.launch import INSTALL, openmpi_prefix, run_ulfm

MESSAGE_LAYOUTS = [  # (ranks, mode, options): the stores whose push and pull travel as messages
    (2, "sync", {"collective": False}),
    (3, "sync", {"servers": 1}),
    (2, "async", {}),
    (2, "ssp", {}),
]


@pytest.mark.parametrize(("size", "mode", "options"), MESSAGE_LAYOUTS)
def test_a_worker_that_initialises_3_where_another_says_str_3_is_named(
    size: int, mode: str, options: dict[str, Any]
) -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        try:
            kv.init(3 if kv.rank == 0 else "3", np.zeros(4))
        except KeyMismatchError as error:
            return str(error)
        return "no error"

    messages = [m for m in run_store(size, body, mode=mode, timeout=1.0, **options) if m is not None]
    assert messages[0] == "no error"  # worker 0's init makes the key
    for message in messages[1:]:
        assert "worker 0 used key 3 (int) instead of '3' (str): they are different keys" in message, message


@pytest.mark.parametrize(("size", "options"), [(2, {"collective": False}), (3, {"servers": 1})])
def test_sync_workers_pushing_3_and_str_3_get_a_key_mismatch_naming_each_other(
    size: int, options: dict[str, Any]
) -> None:
    both = threading.Barrier(2)  # neither closes before both have their answer: a close completes rounds

    def body(kv: KVStore, comm: Communicator) -> str:
        kv.init([3, "3"], [np.zeros(4), np.zeros(4)])
        mine = 3 if kv.rank == 0 else "3"
        kv.push(mine, np.ones(4))
        try:
            kv.pull(mine)
            message = "no error"
        except KeyMismatchError as error:
            message = str(error)
        both.wait(10)
        return message

    messages = [m for m in run_store(size, body, mode="sync", timeout=1.0, **options) if m is not None]
    assert "no push from worker 1; worker 1 used key '3' (str) instead of 3 (int)" in messages[0], messages
    assert "no push from worker 0; worker 0 used key 3 (int) instead of '3' (str)" in messages[1], messages


def test_a_handles_test_is_refused_while_another_threads_call_runs() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        kv.init("w", np.zeros(4))
        message = "no error"
        if kv.rank == 0:
            kv.push("w", np.ones(4))
            handle = kv.pull("w", block=False)  # waits for worker 1's push, after the barrier
            taken, done = threading.Event(), threading.Event()

            def hold() -> None:  # a call of another thread, running
                kv.claim.owner = kv.claim.held[0] = threading.get_ident()
                taken.set()
                done.wait(10)
                kv.claim.owner = 0
                del kv.claim.held[0]

            holder = threading.Thread(target=hold, name="holder")
            holder.start()
            taken.wait(10)
            try:
                handle.test()
            except KVStoreError as error:
                message = str(error)
            done.set()
            holder.join()
            kv.barrier()
            np.testing.assert_array_equal(handle.wait(), np.full(4, 2.0))
        else:
            kv.barrier()
            kv.push("w", np.ones(4))
            kv.pull("w")
        return message

    message = run_store(2, body, mode="sync", collective=False)[0]
    assert "called test on a store while thread 'holder'" in message, message


@pytest.mark.skipif(openmpi_prefix() is None, reason=f"no Open MPI for the ULFM tests ({INSTALL})")
@pytest.mark.parametrize("servers", ["dedicated", "colocated"])
def test_a_dead_server_is_a_store_error_naming_it_from_calls_and_close(servers: str) -> None:
    try:
        result = run_ulfm(3, ["-m", "tests.ulfm.dead_server", servers], timeout=60)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung; its output:\n{str(expired.output)[-4000:]}")
    seen = records(result.stdout, "DEAD ")
    assert sorted(s["rank"] for s in seen) == [0, 1], result.stdout[-4000:]
    for survivor in seen:
        for call in ("push_pull", "close"):
            error = survivor[call]
            assert isinstance(error, dict), seen
            assert error["type"] in ("KVStoreError", "KVStoreTimeout"), seen
            waited = re.search(r"waiting for server ranks? ([\d, ]*\d)", error["text"])
            assert waited is not None and "2" in waited.group(1).split(", "), seen
            dead = re.search(r"failed ranks: ([\d, ]*\d)", error["text"])  # MPI's word on who died
            assert dead is not None and "2" in dead.group(1).split(", "), seen  # (a survivor may have left)
        assert "key 'w'" in survivor["push_pull"]["text"], seen  # type: ignore[index]
        assert survivor["seconds"] < 20, seen


@pytest.mark.parametrize(
    "fields",
    [
        {
            "kind": Kind.PUSH,
            "part": 2,
            "req": 9,
            "stamp": 4,
            "key": b"sgrad",
            "data": np.arange(7, dtype=np.float32),
        },
        {"kind": Kind.PULL, "req": 3, "stamp": 1, "key": b"i12", "flags": QUIET},
        {"kind": Kind.INIT, "key": b"sw", "text": "float64|[2, 3]", "data": np.ones((2, 3))[:, ::2]},
        {
            "kind": Kind.ERROR,
            "aux": int(Refusal.LATE),
            "text": "waited for workers 1, 2",
            "data": np.array([1, 2]),
        },
        {"kind": Kind.DATA, "stamp": 5, "data": np.zeros(0, np.int8)},
    ],
)
def test_a_message_kept_in_the_process_is_what_its_bytes_decode_to(fields: dict[str, Any]) -> None:
    """A colocated worker and its server hand messages over without bytes: same fields, data copied."""
    kept = compose(origin=3, in_process=True, **fields)
    sent = decode(compose(origin=3, **fields))
    for name in ("kind", "origin", "part", "req", "stamp", "aux", "key", "text", "flags"):
        assert getattr(kept, name) == getattr(sent, name), name
    assert bytes(kept.data) == bytes(sent.data)
    source = fields.get("data")
    if source is not None and source.size:
        before = bytes(kept.data)
        source[...] = 42  # the sender's array changed after its call returned
        assert bytes(kept.data) == before


def test_a_colocated_updater_never_sees_the_workers_array_change_under_it() -> None:
    """What a push hands the rank's own server is a copy: the worker may reuse its array at once."""
    kept: list[np.ndarray] = []

    def body(kv: KVStore, comm: Communicator) -> list[float]:
        kv.init("w", np.zeros(3))

        def keep(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
            kept.append(received)  # an updater that holds on to what it was given
            stored += received
            return stored

        kv.set_updater(keep)
        value = np.full(3, 1.0)
        kv.push("w", value, block=False).wait()
        value[...] = -5.0  # reused at once, as a training loop reuses its gradient buffer
        kv.push("w", value)
        return [float(x) for x in kv.pull("w")]

    assert run_store(1, body, mode="async") == [[-4.0, -4.0, -4.0]]
    assert [list(r) for r in kept] == [[1.0] * 3, [-5.0] * 3]


def test_a_large_push_to_the_ranks_own_server_keeps_one_partitions_copy_at_a_time() -> None:
    """Each large request to the rank's own server is handled as it is made, as a large message is sent."""

    def body(kv: KVStore, comm: Communicator) -> int:
        value = np.ones(2 * 2**20)  # 16 MiB: 16 partitions of 1 MiB, all on this rank's server
        kv.init("big", np.zeros_like(value))
        kv.push("big", value)
        tracemalloc.start()
        try:
            kv.push("big", value)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    (peak,) = run_store(1, body, mode="async", partition_bytes=1 << 20)
    assert peak < 4 * 2**20, f"a push of 16 MiB held {peak / 2**20:.1f} MiB at its peak"


@pytest.mark.parametrize(("size", "mode", "options"), MESSAGE_LAYOUTS)
def test_a_pull_of_one_key_into_an_out_is_the_general_pulls_value_and_errors(
    size: int, mode: str, options: dict[str, Any]
) -> None:
    """The one-key pull into ``out`` (a training loop's) checks and answers as every pull does."""

    def body(kv: KVStore, comm: Communicator) -> list[str]:
        kv.init("w", np.zeros((3, 5), np.float32))  # 60 bytes: partitions of 16 over the servers
        kv.push("w", np.full((3, 5), kv.rank + 1, np.float32))
        kv.barrier()  # every push in before the pulls (async and ssp servers apply them as they come)
        out = np.empty((3, 5), np.float32)
        got = kv.pull("w", out=out)
        assert got is out
        np.testing.assert_array_equal(out, kv.pull("w"))  # the general path's value, without out
        if mode == "sync":
            np.testing.assert_array_equal(out, np.full((3, 5), sum(range(1, kv.num_workers + 1))))
        told = []
        for wrong in (np.empty((5, 3), np.float32), np.empty((3, 5)), np.empty((3, 10), np.float32)[:, ::2]):
            with pytest.raises(KeyMismatchError) as raised:
                kv.pull("w", out=wrong)
            told.append(str(raised.value))
        with pytest.raises(KVStoreError, match="never initialised"):
            kv.pull("nope", out=out)
        return told

    for told in run_store(size, body, mode=mode, **options):
        if told is None:  # a dedicated server
            continue
        assert "is float32[5, 3]; the key is float32[3, 5]" in told[0], told[0]
        assert "is float64[3, 5]; the key is float32[3, 5]" in told[1], told[1]
        assert "is not C-contiguous" in told[2], told[2]


def test_a_message_of_another_store_on_a_reused_channel_is_dropped() -> None:
    # MPI gives a freed communicator's context to the next one made: a message of a broken store left
    # unreceived there (a refusal, a close) must not reach the next store, as one of its own would
    from collectives.kvstore._adapter import Channel
    from collectives.transport.loopback import LoopbackWorld

    world = LoopbackWorld(2)
    senders = [Channel(Communicator(world.transport(0)), owned=False, store=store) for store in (1, 2)]
    receiver = Channel(Communicator(world.transport(1)), owned=False, store=2)
    for sender in senders:  # the earlier store's close, then the later store's push
        sender.send(compose(Kind.CLOSE if sender.store == 1 else Kind.PUSH, 0, req=7), 1, REQUEST_TAG)
    taken = receiver.receive(REQUEST_TAG, 5.0)
    assert taken is not None and (taken.kind, taken.store) == (Kind.PUSH, 2)
    assert receiver.take(REQUEST_TAG) is None
