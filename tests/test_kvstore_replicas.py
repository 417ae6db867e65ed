"""A store's shards as in-memory state, restored onto fewer ranks: the lost server's part from its replica."""

import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import ConfigurationError, KVStoreError
from collectives.kvstore import SGD, KVStore, create
from collectives.transport.loopback import LoopbackWorld

SMALL_PARTS = 64  # bytes: several partitions per key, over every server
SHAPES = {"w": ((10, 3), np.float64), "b": ((7,), np.float32)}


def _grad(rank: int, t: int, key: str) -> np.ndarray:
    """Integer-valued, so every sum is exact whatever the order."""
    shape, dtype = SHAPES[key]
    n = int(np.prod(shape))
    return ((np.arange(n) * (rank + 1) + 5 * t + len(key)) % 11).astype(dtype).reshape(shape)


def _rounds(kv: KVStore, rank: int, first: int, last: int) -> dict[str, np.ndarray]:
    pulled = {}
    for t in range(first, last):
        for key in SHAPES:
            pulled[key] = kv.pushpull(key, _grad(rank, t, key))
    return pulled


def _world(size: int, body: Any) -> list[Any]:
    world = LoopbackWorld(size, timeout=60)

    def one(transport: Any) -> Any:
        kv = create("sync", comm=Communicator(transport, timeout=10.0), partition_bytes=SMALL_PARTS)
        with kv:
            return body(kv, transport.rank)

    return world.run(one)


def _before(directory: Path) -> list[dict[str, Any]]:
    """Four ranks train three rounds with momentum; each gives its state (pickled), and a checkpoint."""

    def body(kv: KVStore, rank: int) -> dict[str, Any]:
        for key, (shape, dtype) in SHAPES.items():
            kv.init(key, np.ones(shape, dtype))
        kv.set_optimizer(SGD(lr=0.5, momentum=0.9))
        _rounds(kv, rank, 0, 3)
        state = pickle.loads(pickle.dumps(kv.state()))
        kv.save(directory)
        return state

    return _world(4, body)


def test_survivors_restore_the_lost_servers_partitions_and_go_on_as_from_a_directory(tmp_path: Path) -> None:
    states = _before(tmp_path)
    lost, survivors = 2, [0, 1, 3]
    adopter = 3  # the next rank of the ring keeps the lost rank's replica

    def restored(kv: KVStore, rank: int) -> Any:
        old = survivors[rank]
        kv.restore([states[old]] + ([states[lost]] if old == adopter else []))
        now = {key: kv.pull(key) for key in SHAPES}
        return now, _rounds(kv, rank, 3, 5), kv.explain("w")

    def loaded(kv: KVStore, rank: int) -> Any:
        kv.load(tmp_path)
        now = {key: kv.pull(key) for key in SHAPES}
        return now, _rounds(kv, rank, 3, 5), kv.explain("w")

    got, expected = _world(3, restored), _world(3, loaded)
    for rank in range(3):
        for key in SHAPES:
            for label, index in (("on restoring", 0), ("two rounds on", 1)):
                a, b = got[rank][index][key], expected[rank][index][key]
                assert a.dtype == b.dtype and a.tobytes() == b.tobytes(), f"{key} {label}, rank {rank}"
        assert "over 3 server(s)" in got[rank][2]
    # momentum came back too: without it the next rounds would differ from the directory's
    assert not np.array_equal(got[0][1]["w"], got[0][0]["w"])


def test_a_lost_state_not_passed_is_named_on_every_rank(tmp_path: Path) -> None:
    states = _before(tmp_path)

    def restored(kv: KVStore, rank: int) -> str:
        with pytest.raises(KVStoreError) as caught:
            kv.restore([states[[0, 1, 3][rank]]])
        return str(caught.value)

    for message in _world(3, restored):
        assert "'w'" in message and "Recovery.adopted" in message  # w has a partition on every server


def test_state_and_restore_refuse_dedicated_servers_and_a_store_with_keys() -> None:
    world = LoopbackWorld(2, timeout=60)

    def one(transport: Any) -> Any:
        comm = Communicator(transport, timeout=10.0)
        kv = create("sync", comm=comm, servers=1)
        if kv.role == "server":
            return None
        with kv, pytest.raises(ConfigurationError, match="colocated"):
            kv.state()
        return True

    assert world.run(one) == [True, None]

    def keyed(kv: KVStore, rank: int) -> bool:
        kv.init("w", np.zeros(3))
        with pytest.raises(KVStoreError, match="keys already"):
            kv.restore([kv.state()])
        return True

    assert _world(2, keyed) == [True, True]
