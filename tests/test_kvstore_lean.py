"""The store's leaner message path: the messages each operation takes, and a refused push still raised."""

from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import KVStoreError
from collectives.kvstore import KVStore, create
from collectives.kvstore._wire import decode
from collectives.kvstore.link import WINDOW
from collectives.transport.loopback import LoopbackWorld

MESSAGE_LAYOUTS = [  # (ranks, mode, options): the stores whose push and pull travel as messages
    (2, "sync", {"collective": False}),
    (3, "sync", {"servers": 1}),
    (3, "sync", {"collective": False, "servers": 2}),
    (2, "async", {}),
    (3, "async", {"servers": 1}),
    (2, "ssp", {}),
]


def run_counted(
    size: int, body: Callable[[KVStore, Counter[str]], Any], **options: Any
) -> tuple[list[Any], Counter[str]]:
    """``body(kv, mark)`` on every worker over loopback ranks; the messages every rank sent, by kind.

    Only messages sent while some worker's ``mark["on"]`` is 1 are counted.
    """
    world = LoopbackWorld(size, timeout=60)
    sent: Counter[str] = Counter()
    mark: Counter[str] = Counter()

    def one(transport: Any) -> Any:
        isend = transport.isend

        def counting(buffer: Any, dst: int, tag: int) -> Any:
            if mark["on"]:
                sent[decode(buffer).kind.name] += 1
            return isend(buffer, dst, tag)

        transport.isend = counting
        kv = create(comm=Communicator(transport, timeout=10.0), **options)
        if kv.role == "server":
            return None
        with kv:
            return body(kv, mark)

    return world.run(one), sent


def crossing(kv: KVStore, server: int, colocated: bool) -> int:
    """1 if this worker's requests to ``server`` travel by MPI, 0 if they go to its own rank's server."""
    return int(not colocated or server != kv.rank)


@pytest.mark.parametrize(("size", "mode", "options"), MESSAGE_LAYOUTS)
def test_a_push_then_pull_takes_three_messages_per_worker(
    size: int, mode: str, options: dict[str, Any]
) -> None:
    rounds, workers = 5, size - options.get("servers", 0)
    colocated = "servers" not in options

    def body(kv: KVStore, mark: Counter[str]) -> tuple[float, int, int]:
        kv.init("w", np.zeros(8))  # one partition
        kv.barrier()
        mark["on"] = 1
        for _ in range(rounds):
            kv.push("w", np.full(8, kv.rank + 1.0))
            kv.pull("w")
        kv.barrier()
        mark["on"] = 0
        remote = crossing(kv, kv._keys["w"].parts[0].server, colocated)
        barrier = crossing(kv, size - kv.num_servers, colocated)  # the first server's
        return float(kv.pull("w")[0]), remote, barrier  # every push applied: the barrier came after them

    results, sent = run_counted(size, body, mode=mode, **options)
    done = [r for r in results if r is not None]
    total = sum(range(1, workers + 1))
    assert all(r[0] == (total if mode == "sync" else total * rounds) for r in done), results
    remote, barrier = sum(r[1] for r in done), sum(r[2] for r in done)
    assert remote > 0  # some worker's requests cross, so the count says something
    # a push's OK is implied by the pull's DATA that follows it from the same server; a
    # worker's requests to its own rank's server, and the replies, do not go through MPI
    assert sent["PUSH"] == sent["PULL"] == sent["DATA"] == rounds * remote, sent
    assert sent["CONFIRM"] == 0, sent  # the pulls confirmed every push before the barrier
    assert sent["BARRIER"] == sent["OK"] == barrier, sent  # the barrier's own only


def test_a_clock_is_not_answered() -> None:
    clocks = 4

    def body(kv: KVStore, mark: Counter[str]) -> None:
        kv.barrier()
        mark["on"] = 1
        for _ in range(clocks):
            kv.clock()
        mark["on"] = 0
        kv.barrier()

    _, sent = run_counted(2, body, mode="ssp", staleness=1)
    assert sent == Counter({"CLOCK": 2 * clocks}), sent  # 2 workers, each to the other's server, no OK


def test_a_worker_only_pushing_is_acknowledged_once_a_window() -> None:
    pushes = 2 * (WINDOW + 1)

    def body(kv: KVStore, mark: Counter[str]) -> float:
        kv.init("w", np.zeros(4))
        mark["on"] = 1
        for _ in range(pushes):
            kv.push("w", np.ones(4))
        mark["on"] = 0
        return float(kv.pull("w")[0])

    results, sent = run_counted(2, body, mode="async", servers=1)  # a worker and a server
    assert results == [pushes, None]
    assert sent == Counter({"PUSH": pushes, "OK": 2}), sent  # every (WINDOW + 1)-th push is answered


@pytest.mark.parametrize(("size", "options"), [(2, {}), (3, {"servers": 1})])
def test_a_refused_push_returns_and_the_next_wait_raises_it_naming_key_and_server(
    size: int, options: dict[str, Any]
) -> None:
    def refuse(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
        if received[0] < 0:
            raise ValueError(f"negative push to {key!r}")
        return stored + received

    def body(kv: KVStore, mark: Counter[str]) -> list[str]:
        kv.init("w", np.zeros(4))
        kv.barrier()
        seen = []
        if kv.rank == 0:
            kv.push("w", np.full(4, -1.0))  # refused by the server, after this returns
            seen.append("push returned")
            try:
                kv.pull("w")
                seen.append("pull returned")
            except KVStoreError as error:
                seen.append(str(error))
            kv.push("w", np.ones(4))
            seen.append(f"then {kv.pull('w')[0]:g}")  # the store goes on; the refusal was raised once
        kv.barrier()
        return seen

    results, _ = run_counted(size, body, mode="async", updater=refuse, **options)
    seen = results[0]
    assert seen[0] == "push returned", seen
    assert "failed on push" in seen[1] and "negative push to 'w'" in seen[1], seen
    assert "server rank" in seen[1], seen
    assert seen[2] == "then 1", seen


def test_a_push_before_a_barrier_is_applied_before_any_worker_leaves_it() -> None:
    # the key's server is not the barrier's (the first server): only a confirmation orders them
    def body(kv: KVStore, mark: Counter[str]) -> list[float]:
        keys = [f"k{i}" for i in range(6)]  # hashed over the 3 servers
        kv.init(keys, [np.zeros(2) for _ in keys])
        got = []
        for t in range(3):
            if kv.rank == t % 2:
                kv.push(keys, [np.ones(2) for _ in keys])
            kv.barrier()
            got += [float(kv.pull(k)[0]) for k in keys]
            kv.barrier()
        return got

    results, _ = run_counted(3, body, mode="async")
    for got in results:
        assert got == [1.0] * 6 + [2.0] * 6 + [3.0] * 6, got


@pytest.mark.parametrize(("size", "mode", "options"), MESSAGE_LAYOUTS)
def test_a_calls_requests_to_one_server_travel_as_one_message(
    size: int, mode: str, options: dict[str, Any]
) -> None:
    keys, workers = [f"k{i}" for i in range(8)], size - options.get("servers", 0)
    colocated = "servers" not in options

    def body(kv: KVStore, mark: Counter[str]) -> tuple[list[float], int, int]:
        kv.init(keys, [np.zeros(3) for _ in keys])  # one partition each, hashed over the servers
        servers = {kv._keys[k].parts[0].server for k in keys}
        kv.barrier()
        mark["on"] = 1
        kv.push(keys, [np.full(3, float(i + kv.rank)) for i in range(len(keys))])
        kv.pull(keys)
        kv.barrier()
        mark["on"] = 0
        barrier = crossing(kv, size - kv.num_servers, colocated)
        return [float(v[0]) for v in kv.pull(keys)], sum(crossing(kv, s, colocated) for s in servers), barrier

    results, sent = run_counted(size, body, mode=mode, **options)
    done = [r for r in results if r is not None]
    assert done[0][0] == [float(sum(i + r for r in range(workers))) for i in range(len(keys))]
    remote, barrier = sum(r[1] for r in done), sum(r[2] for r in done)
    assert remote > 0
    # each worker: its pushes to a server in one message, its pulls in one, their replies in one
    assert sum(sent.values()) - 2 * barrier == 3 * remote, sent
    assert sent["BATCH"] == 3 * remote, sent  # 8 keys over the servers: several each


@pytest.mark.parametrize(("size", "mode", "options"), MESSAGE_LAYOUTS)
def test_a_message_pushpull_is_one_message_and_one_reply_per_worker(
    size: int, mode: str, options: dict[str, Any]
) -> None:
    rounds, workers = 4, size - options.get("servers", 0)
    colocated = "servers" not in options

    def body(kv: KVStore, mark: Counter[str]) -> tuple[float, int, int]:
        kv.init("w", np.zeros(8))  # one partition
        kv.barrier()
        mark["on"] = 1
        for _ in range(rounds):
            kv.pushpull("w", np.full(8, kv.rank + 1.0))
        kv.barrier()
        mark["on"] = 0
        remote = crossing(kv, kv._keys["w"].parts[0].server, colocated)
        return float(kv.pull("w")[0]), remote, crossing(kv, size - kv.num_servers, colocated)

    results, sent = run_counted(size, body, mode=mode, **options)
    done = [r for r in results if r is not None]
    total = sum(range(1, workers + 1))
    assert all(r[0] == (total if mode == "sync" else total * rounds) for r in done)
    remote, barrier = sum(r[1] for r in done), sum(r[2] for r in done)
    assert remote > 0
    # the push and the pull in one bundle, the DATA alone (the push is quiet)
    expected = {"BATCH": rounds * remote, "DATA": rounds * remote, "BARRIER": barrier, "OK": barrier}
    assert sent == Counter({k: v for k, v in expected.items() if v}), sent
