"""The key-value store on the loopback transport: exact sums in every mode, updaters, and clear errors."""

import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives
from collectives import Communicator
from collectives.errors import (
    ConfigurationError,
    InvalidRowsError,
    KeyMismatchError,
    KVStoreError,
    KVStoreTimeout,
    UnknownKeyError,
)
from collectives.kvstore import SGD, Adam, KVStore, create
from collectives.kvstore.layout import Roles, partition, stable_hash
from collectives.transport.loopback import LoopbackWorld

SMALL_PARTS = 64  # bytes: cuts the tests' values into several partitions


def run_store(
    size: int, body: Callable[[KVStore, Communicator], Any], *, timeout: float = 10.0, **options: Any
) -> list[Any]:
    """``body(kv, comm)`` on every worker of a store over ``size`` loopback ranks; results by rank.

    Dedicated server ranks (``servers=k``) serve until the workers close, and give ``None``.
    """
    world = LoopbackWorld(size, timeout=60)

    def one(transport: Any) -> Any:
        comm = Communicator(transport, timeout=timeout)
        kv = create(comm=comm, **{"partition_bytes": SMALL_PARTS, **options})
        if kv.role == "server":
            return None
        with kv:
            return body(kv, comm)

    return world.run(one)


LAYOUTS = [(1, None), (2, None), (3, None), (2, 1), (3, 1), (3, 2), (4, 3)]
"""(ranks, dedicated servers): colocated on 1 to 3 ranks, and 1, 2 and 3 dedicated servers."""


def _servers(size: int, dedicated: int | None) -> int:
    return dedicated or size


def _push(rank: int, t: int, n: int) -> np.ndarray:
    """Worker ``rank``'s round-``t`` push: integer-valued, so every sum is exact in any order."""
    return ((np.arange(n) * (rank + 1) + 7 * t + rank) % 23).astype(np.float32)


@pytest.mark.parametrize(("size", "dedicated"), LAYOUTS)
def test_sync_pulls_the_round_aggregate_bitwise_equal_to_an_allreduce(
    size: int, dedicated: int | None
) -> None:
    rounds, n = 6, 50
    workers = size - (dedicated or 0)

    def body(kv: KVStore, comm: Communicator) -> list[np.ndarray]:
        assert (kv.num_workers, kv.num_servers) == (workers, _servers(size, dedicated))
        kv.init("w", np.zeros(n, np.float32))
        kv.init(5, np.zeros(3, np.float32))  # one partition, on a hashed server
        pulled = []
        for t in range(rounds):
            kv.push("w", _push(kv.rank, t, n))
            got = kv.pull("w")
            expected = sum(_push(r, t, n) for r in range(workers))
            np.testing.assert_array_equal(got, expected)
            if dedicated is None:
                np.testing.assert_array_equal(got, collectives.allreduce(_push(kv.rank, t, n), comm=comm))
            pulled.append(got)
            small = kv.pushpull(5, np.full(3, kv.rank + t, np.float32))
            assert (small == sum(r + t for r in range(workers))).all()
        return pulled

    results = [r for r in run_store(size, body, mode="sync", servers=dedicated) if r is not None]
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            assert a.tobytes() == b.tobytes()


@pytest.mark.parametrize("mode", ["async", "ssp"])
@pytest.mark.parametrize(("size", "dedicated"), LAYOUTS)
def test_after_every_push_the_value_is_the_exact_sum(mode: str, size: int, dedicated: int | None) -> None:
    rounds, n = 8, 40
    workers = size - (dedicated or 0)
    start = np.arange(n, dtype=np.float64)

    def body(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.init("w", start if kv.rank == 0 else np.zeros(n))
        for t in range(rounds):
            kv.push("w", _push(kv.rank, t, n).astype(np.float64))
            kv.clock()
        kv.barrier()
        return np.asarray(kv.pull("w"))

    results = [r for r in run_store(size, body, mode=mode, servers=dedicated) if r is not None]
    expected = start + sum(_push(r, t, n) for r in range(workers) for t in range(rounds))
    for got in results:
        np.testing.assert_array_equal(got, expected)


def test_async_pulls_never_see_a_torn_partition() -> None:
    n, rounds, workers = 300, 40, 3  # 300 float64: 38 partitions of 64 bytes over 3 servers

    def body(kv: KVStore, comm: Communicator) -> int:
        kv.init("w", np.zeros(n))
        seen = 0
        for _ in range(rounds):
            kv.push("w", np.ones(n), block=False)  # each push adds 1 to every element
            pulled = kv.pull("w", report=True)
            for p in kv._keys["w"].parts:
                values = pulled.value[p.lo : p.hi]
                # a partition is updated whole: all its elements equal, and the count it reports
                assert (values == values[0]).all(), f"torn partition {p.index}: {values}"
                assert values[0] == pulled.included[p.index]
                assert 0 <= values[0] <= workers * rounds
                seen += 1
        return seen

    assert all(run_store(workers, body, mode="async"))


@pytest.mark.parametrize("staleness", [0, 1, 3])
@pytest.mark.parametrize("dedicated", [None, 1])
def test_ssp_bound_holds_in_every_pull_with_a_slow_worker(staleness: int, dedicated: int | None) -> None:
    clocks, n = 10, 8
    size = 3 + (dedicated or 0)

    def body(kv: KVStore, comm: Communicator) -> list[tuple[int, int, float]]:
        kv.init("w", np.zeros(n))
        log = []
        for c in range(clocks):
            if kv.rank == 0:
                time.sleep(0.01)  # the straggler
            pulled = kv.pull("w", report=True)
            # every worker's pushes of clocks <= c - s - 1 are in: each pushed 1 per clock
            bound = c - staleness - 1
            log.append((c, min(pulled.included), float(pulled.value[0])))
            assert min(pulled.included) >= bound, (c, pulled.included)
            assert pulled.value[0] >= 3 * (bound + 1), (c, pulled.value)
            kv.push("w", np.ones(n))
            kv.clock()
        return log

    logs = [r for r in run_store(size, body, mode="ssp", staleness=staleness, servers=dedicated) if r]
    assert len(logs) == 3


def test_optimizers_run_on_the_servers_shards() -> None:
    pytest.importorskip("torch", reason="torch.optim is the reference (torch==2.13.0)")
    n, steps, workers = 30, 5, 3
    grads = [[np.full(n, (r + 1) * (t + 1) * 0.5) for t in range(steps)] for r in range(workers)]

    def reference(optimizer: Any) -> np.ndarray:
        import torch

        param = torch.ones(n, dtype=torch.float64, requires_grad=True)
        opt = optimizer([param])
        for t in range(steps):
            param.grad = torch.from_numpy(sum(grads[r][t] for r in range(workers)))
            opt.step()
        return param.detach().numpy()

    import torch

    cases = [
        (SGD(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9)),
        (Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ]
    for optimizer, torch_optimizer in cases:

        def body(kv: KVStore, comm: Communicator, optimizer: Any = optimizer) -> np.ndarray:
            kv.init("p", np.ones(n))
            kv.set_optimizer(optimizer)
            for t in range(steps):
                got = kv.pushpull("p", grads[kv.rank][t])
            return np.asarray(got)

        for layout in [{}, {"servers": 1}]:
            size = workers + layout.get("servers", 0)
            for got in run_store(size, body, mode="sync", **layout):
                if got is not None:
                    np.testing.assert_allclose(got, reference(torch_optimizer), rtol=1e-12)


def test_a_custom_updater_and_the_max_reducer() -> None:
    def body(kv: KVStore, comm: Communicator) -> tuple[np.ndarray, np.ndarray]:
        kv.init("acc", np.zeros(4))
        kv.set_updater(lambda key, received, stored: stored + 2 * received)
        for _ in range(3):
            kv.push("acc", np.ones(4))
        acc = kv.pull("acc")
        return acc, np.empty(0)

    for acc, _ in run_store(2, body, mode="sync"):
        np.testing.assert_array_equal(acc, np.full(4, 12.0))  # 3 rounds of 2 * (1 + 1)

    def maxed(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.init("m", np.zeros(5))
        kv.push("m", np.arange(5.0) * (kv.rank + 1))
        return np.asarray(kv.pull("m"))

    for got in run_store(3, maxed, mode="sync", op="max"):
        np.testing.assert_array_equal(got, np.arange(5.0) * 3)


def test_lists_of_keys_non_blocking_handles_and_out() -> None:
    def body(kv: KVStore, comm: Communicator) -> None:
        kv.init(["a", "b"], [np.zeros(10), np.zeros((2, 3), np.int64)])
        handle = kv.push(["a", "b"], [np.ones(10), np.ones((2, 3), np.int64)], block=False)
        handle.wait()
        out = [np.empty(10), np.empty((2, 3), np.int64)]
        pulled = kv.pull(["a", "b"], out=out, block=False)
        while not pulled.test():
            time.sleep(1e-3)
        a, b = pulled.wait()
        assert a is out[0] and b is out[1]
        assert (a == kv.num_workers).all() and (b == kv.num_workers).all()
        assert "partition 0" in kv.explain("a")

    run_store(2, body, mode="sync")


def test_bad_keys_and_values_are_named() -> None:
    def body(kv: KVStore, comm: Communicator) -> None:
        kv.init("w", np.zeros(6, np.float32))
        with pytest.raises(UnknownKeyError, match=r"key 'nope' was never initialised \(rank \d\)"):
            kv.push("nope", np.zeros(6, np.float32))
        with pytest.raises(UnknownKeyError, match="'nope'"):
            kv.pull("nope")
        with pytest.raises(
            KeyMismatchError, match=r"key 'w' on rank \d is float64\[6\]; the key is float32\[6\]"
        ):
            kv.push("w", np.zeros(6))
        with pytest.raises(KeyMismatchError, match=r"is float32\[7\]"):
            kv.pull("w", out=np.zeros(7, np.float32))
        with pytest.raises(KVStoreError, match="initialised already"):
            kv.init("w", np.zeros(6, np.float32))

    run_store(2, body)


def test_workers_that_initialise_a_key_differently_are_told() -> None:
    def body(kv: KVStore, comm: Communicator) -> str:
        try:
            kv.init("w", np.zeros(4 if kv.rank == 0 else 5, np.float32))
        except KeyMismatchError as error:
            return str(error)
        return ""

    messages = run_store(2, body, partition_bytes=1 << 20)
    assert messages[0] == ""
    assert "worker 1 initialised key 'w' partition 0 as float32|5; worker 0 as float32|4" in messages[1]


def test_a_worker_that_stops_pushing_is_named_within_the_timeout() -> None:
    def body(kv: KVStore, comm: Communicator) -> float:
        kv.init("w", np.zeros(4))
        if kv.rank == 2:
            time.sleep(2.5)  # pushes nothing, then leaves
            return 0.0
        kv.push("w", np.ones(4))
        started = time.monotonic()
        with pytest.raises(KVStoreTimeout) as caught:
            kv.pull("w")
        assert caught.value.workers == (2,), str(caught.value)
        assert "round 0 of key 'w' partition 0: no push from worker 2" in str(caught.value)
        return time.monotonic() - started

    waits = run_store(3, body, mode="sync", timeout=1.0, collective=False)
    assert all(0.9 <= w < 4 for w in waits[:2]), waits


def test_a_worker_that_closed_is_no_longer_waited_for() -> None:
    rounds = 4

    def body(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.init("w", np.zeros(3))
        last = np.zeros(3)
        for _ in range(rounds if kv.rank != 2 else 1):  # worker 2's last epoch is shorter
            kv.push("w", np.ones(3))
            last = kv.pull("w")
        if kv.rank == 2:
            kv.close()
            return last
        return last

    results = run_store(3, body, mode="sync", timeout=5.0, collective=False)
    np.testing.assert_array_equal(results[0], np.full(3, 2.0))  # the last rounds summed over workers 0 and 1
    np.testing.assert_array_equal(results[2], np.full(3, 3.0))


def test_a_dedicated_server_that_never_answers_is_named() -> None:
    world = LoopbackWorld(2, timeout=60)

    def one(transport: Any) -> str:
        comm = Communicator(transport, timeout=0.5)
        if transport.rank == 1:
            time.sleep(6)  # never creates the store: a dead server
            return ""
        kv = create(comm=comm, servers=1)
        with pytest.raises(KVStoreTimeout) as caught:
            kv.init("w", np.zeros(2))
        assert caught.value.servers == (1,)
        kv._closed = True  # the server is gone: nothing to close
        return str(caught.value)

    message = world.run(one)[0]
    assert "waited 5.5 s for server rank 1 to answer (key 'w')" in message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"mode": "bsp"}, "unknown mode 'bsp'; the modes are sync, async, ssp"),
        ({"mode": "ssp", "staleness": -1}, "staleness must be an int >= 0, got -1"),
        ({"mode": "sync", "staleness": 2}, "staleness=2 applies to mode 'ssp', not 'sync'"),
        ({"servers": 1}, "servers=1 leaves no worker among 1 ranks"),
    ],
)
def test_bad_configurations_are_refused(options: dict[str, Any], message: str) -> None:
    comm = Communicator(LoopbackWorld(1).transport(0))
    with pytest.raises(ConfigurationError, match=message.replace("(", r"\(")):
        create(comm=comm, **options)


def test_colocated_servers_need_threads() -> None:
    transport = LoopbackWorld(1).transport(0)
    transport_level = type(transport).thread_level
    try:
        type(transport).thread_level = property(lambda self: "funneled")  # type: ignore[assignment]
        with pytest.raises(ConfigurationError, match="colocated servers need MPI_THREAD_MULTIPLE"):
            create(comm=Communicator(transport))
    finally:
        type(transport).thread_level = transport_level  # type: ignore[assignment]


def test_layout_is_stable_and_covers_the_value() -> None:
    assert stable_hash("w") == stable_hash("w") != stable_hash("x")
    assert stable_hash(3) != stable_hash("3")
    assert stable_hash("embedding") == 12947909314257335037  # the same in every process and run
    parts = partition("w", 1000, 4, (0, 1, 2), 400)  # 10 partitions over 3 servers
    assert parts[0].lo == 0 and parts[-1].hi == 1000
    assert all(a.hi == b.lo for a, b in itertools.pairwise(parts))
    assert [p.server for p in parts] == sorted(p.server for p in parts)  # runs in server order
    assert {p.server for p in parts} == {0, 1, 2}
    assert len(partition("w", 10, 4, (5, 6), 400)) == 1
    roles = Roles(5, 2)
    assert roles.worker_ranks == (0, 1, 2) and roles.server_ranks == (3, 4)


def test_loopback_probe_finds_any_source_and_times_out() -> None:
    world = LoopbackWorld(3, timeout=5)
    a, b, c = (world.transport(r) for r in range(3))
    assert c.probe(11, 0.01) is None
    b.isend(np.arange(3, dtype=np.int64), 2, 11)
    threading.Timer(0.05, lambda: a.isend(np.zeros(2, np.uint8), 2, 11)).start()
    assert c.probe(11, 1.0) == (1, 24)
    buffer = bytearray(24)
    c.waitall([c.irecv(buffer, 1, 11)])
    assert c.probe(11, 1.0) == (0, 2)
    assert c.take(11) == (0, bytearray(2))  # the probed message, received whole
    assert c.take(11) is None  # never waits


@pytest.mark.parametrize("size", [1, 2, 3])
def test_collective_pushpull_equals_the_message_path_and_an_allreduce(size: int) -> None:
    n, rounds = 200, 4  # 800 bytes: 13 partitions of 64 bytes, in runs in rank order

    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init("big", np.zeros(n, np.float32))
        kv.init("small", np.zeros(3, np.float32))  # one partition: reduce and broadcast
        got = []
        for t in range(rounds):
            x = _push(kv.rank, t, n)
            big, small = kv.pushpull(["big", "small"], [x, x[:3]])
            reference = collectives.allreduce(x, comm=comm)
            np.testing.assert_array_equal(big, reference)
            np.testing.assert_array_equal(small, reference[:3])
            # the message path sees the same round
            np.testing.assert_array_equal(kv.pull("big"), reference)
            got.append(big.tobytes())
        return got

    fast = run_store(size, body, mode="sync")
    slow = run_store(size, body, mode="sync", collective=False)
    assert all(f == fast[0] for f in fast) and fast == slow


def test_a_worker_missing_from_a_collective_pushpull_is_named() -> None:
    def body(kv: KVStore, comm: Communicator) -> None:
        kv.init("w", np.zeros(40, np.float32))
        if kv.rank == 1:
            time.sleep(2.0)
            return
        with pytest.raises(KVStoreTimeout) as caught:
            kv.pushpull("w", np.ones(40, np.float32))
        assert caught.value.workers == (1,), str(caught.value)
        assert "pushpull of key 'w' on rank 0: workers [1] did not take part" in str(caught.value)

    run_store(2, body, mode="sync", timeout=1.0)  # and the store still closes on both


def test_an_ssp_worker_that_falls_too_far_behind_is_named() -> None:
    def body(kv: KVStore, comm: Communicator) -> None:
        kv.init("w", np.zeros(2))
        if kv.rank == 1:
            time.sleep(2.0)  # stuck at clock 0
            return
        for _ in range(2):
            kv.push("w", np.ones(2))
            kv.clock()
        with pytest.raises(KVStoreTimeout) as caught:
            kv.pull("w")  # at clock 2 with staleness 1: needs worker 1's clock 0
        assert caught.value.workers == (1,)
        assert "for clock 0 of key 'w' partition 0: worker 1 at clock 0" in str(caught.value)

    run_store(2, body, mode="ssp", staleness=1, timeout=0.5)


def test_a_barrier_names_the_worker_that_never_came() -> None:
    world = LoopbackWorld(2, timeout=60)

    def one(transport: Any) -> None:
        # the store's own timeout, shorter than the communicator's
        kv = create(comm=Communicator(transport, timeout=30), timeout=0.5)
        if kv.rank == 0:
            with pytest.raises(KVStoreTimeout, match=r"barrier 1: server rank 0 waited 0\.5 s for worker 1"):
                kv.barrier()
        else:
            time.sleep(1.5)
        kv.close()

    world.run(one)


def _training(kv: KVStore, steps: range, n: int) -> np.ndarray:
    """SGD steps on the servers with gradients that are not integers, so bits tell runs apart."""
    w = np.empty(n)
    for step in steps:
        grad = np.sin(np.arange(n) * 0.37 + step + kv.rank) / 3
        w = kv.pushpull("w", grad)
    return np.asarray(w)


@pytest.mark.parametrize(("size", "dedicated"), [(2, None), (3, 1), (4, 2)])
def test_a_run_resumed_from_a_checkpoint_continues_bitwise(
    tmp_path: Any, size: int, dedicated: int | None
) -> None:
    n, k, total = 100, 3, 6  # 100 float64 in 64-byte partitions: 13 of them, re-cut over other servers

    def uninterrupted(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.init("w", np.ones(n))
        kv.set_optimizer(Adam(lr=0.05))
        _training(kv, range(k), n)
        kv.save(tmp_path / "ckpt")
        return _training(kv, range(k, total), n)

    expected = run_store(2, uninterrupted, mode="sync")  # 2 workers, 2 colocated servers

    def resumed(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.load(tmp_path / "ckpt")
        return _training(kv, range(k, total), n)

    got = [r for r in run_store(size, resumed, mode="sync", servers=dedicated) if r is not None]
    assert len(got) == 2
    for a, b in zip(got, expected, strict=True):
        assert a.tobytes() == b.tobytes()


def test_partial_missing_and_foreign_checkpoints_are_refused(tmp_path: Any) -> None:
    def save(kv: KVStore, comm: Communicator) -> None:
        kv.init("w", np.arange(40.0))
        kv.save(tmp_path / "a")
        kv.push("w", np.ones(40))
        kv.save(tmp_path / "b")

    run_store(2, save, mode="async")
    (tmp_path / "a" / "shard-1.state").replace(tmp_path / "b" / "shard-1.state")  # b: a mix of two saves
    (tmp_path / "a" / "shard-0.state").unlink()
    cases = [
        (tmp_path / "missing", "no checkpoint directory"),
        (tmp_path / "a", "is partial or damaged: .*shard-0.state: cannot read it"),
        (tmp_path / "b", "is partial: shard-1.state belongs to checkpoint"),
    ]
    for directory, message in cases:

        def load(kv: KVStore, comm: Communicator, directory: Any = directory, message: str = message) -> None:
            with pytest.raises(KVStoreError, match=message):
                kv.load(directory)

        run_store(2, load, mode="async")

    def not_a_checkpoint(kv: KVStore, comm: Communicator) -> None:
        (tmp_path / "c").mkdir(exist_ok=True)
        with pytest.raises(KVStoreError, match=r"no manifest\.json"):
            kv.load(tmp_path / "c")

    run_store(2, not_a_checkpoint, mode="sync")


def test_a_checkpoint_of_another_mode_is_refused(tmp_path: Any) -> None:
    def save(kv: KVStore, comm: Communicator) -> None:
        kv.init("w", np.arange(4.0))
        kv.save(tmp_path)

    run_store(1, save, mode="async")

    def load(kv: KVStore, comm: Communicator) -> None:
        with pytest.raises(KVStoreError, match="is of a 'async' store, this one is 'sync'"):
            kv.load(tmp_path)

    run_store(1, load, mode="sync")


def _row_push(rank: int, t: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``rank``'s round-``t`` sparse push to a 20x4 table: a few rows, some shared with others."""
    ids = np.array(sorted({(rank * 3 + t) % 20, (rank + 7) % 20, 12, 19}))
    return ids, (np.outer(ids + 1, np.arange(1, 5)) * (rank + t + 1)).astype(np.float64)


@pytest.mark.parametrize(("size", "dedicated"), [(1, None), (3, None), (3, 1), (4, 2)])
def test_sparse_rows_travel_and_update_alone(size: int, dedicated: int | None) -> None:
    workers = size - (dedicated or 0)
    rounds = 4

    def expected_table(mode: str) -> np.ndarray:
        table = np.full((20, 4), -1.0)
        if mode == "async":
            table[:] = -1.0
            for t in range(rounds):
                for r in range(workers):
                    ids, values = _row_push(r, t)
                    table[ids] += values
            return table
        for t in range(rounds):  # sync: each round's pushed rows become the round's sum
            touched: dict[int, np.ndarray] = {}
            for r in range(workers):
                ids, values = _row_push(r, t)
                for i, row in zip(ids, values, strict=True):
                    touched[int(i)] = touched.get(int(i), 0) + row
            for i, row in touched.items():
                table[i] = row
        return table

    for mode in ["sync", "async"]:

        def body(kv: KVStore, comm: Communicator, mode: str = mode) -> np.ndarray:
            kv.init("emb", np.full((20, 4), -1.0))
            for t in range(rounds):
                ids, values = _row_push(kv.rank, t)
                got = kv.pushpull("emb", values, rows=ids)
                assert got.shape == (len(ids), 4)
                if mode == "sync":
                    np.testing.assert_array_equal(got, expected_round_rows(t, ids))
            kv.barrier()
            picked = kv.pull("emb", rows=[19, 0, 12])
            table = kv.pull("emb")
            np.testing.assert_array_equal(picked, table[[19, 0, 12]])
            return np.asarray(table)

        def expected_round_rows(t: int, ids: np.ndarray) -> np.ndarray:
            rows = {}
            for r in range(workers):
                their_ids, values = _row_push(r, t)
                for i, row in zip(their_ids, values, strict=True):
                    rows[int(i)] = rows.get(int(i), 0) + row
            return np.array([rows[int(i)] for i in ids])

        for table in run_store(size, body, mode=mode, servers=dedicated, partition_bytes=64):
            if table is not None:
                np.testing.assert_array_equal(table, expected_table(mode))


def test_row_updates_of_an_optimizer_touch_only_those_rows() -> None:
    n_rows, steps = 12, 4

    def body(kv: KVStore, comm: Communicator) -> np.ndarray:
        kv.init("emb", np.ones((n_rows, 3)))
        kv.set_optimizer(SGD(lr=0.5, momentum=0.5))
        for t in range(steps):
            ids = np.array([t % n_rows, 5])
            kv.push("emb", np.full((2, 3), float(t + 1)), rows=ids)
        return np.asarray(kv.pull("emb"))

    table = run_store(2, body, mode="sync", partition_bytes=48)[0]
    reference = np.ones((n_rows, 3))
    velocity = np.zeros((n_rows, 3))
    for t in range(steps):
        ids = [t % n_rows, 5]
        grad = np.full((2, 3), 2.0 * (t + 1))  # two workers pushed the same rows
        velocity[ids] = 0.5 * velocity[ids] + grad
        reference[ids] -= 0.5 * velocity[ids]
    np.testing.assert_allclose(table, reference, rtol=1e-15)
    assert (table[6:] == 1).all()  # rows never pushed keep their value


def test_bad_rows_are_named() -> None:
    def body(kv: KVStore, comm: Communicator) -> None:
        kv.init(["emb", "vec"], [np.zeros((10, 2)), np.zeros(10)])
        with pytest.raises(InvalidRowsError, match=r"rows of key 'emb' on rank 0 must be in 0\.\.9, got 10"):
            kv.push("emb", np.zeros((2, 2)), rows=[3, 10])
        with pytest.raises(InvalidRowsError, match="repeat a row"):
            kv.pull("emb", rows=[3, 3])
        with pytest.raises(
            InvalidRowsError, match=r"needs a key of 2 or more dimensions; key 'vec' is \[10\]"
        ):
            kv.pull("vec", rows=[1])
        with pytest.raises(
            KeyMismatchError, match=r"value for 2 rows of key 'emb' on rank 0 is float64\[3, 2\]"
        ):
            kv.push("emb", np.zeros((3, 2)), rows=[1, 2])

    run_store(1, body, mode="async")
