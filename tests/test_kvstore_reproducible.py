"""The key-value store with reproducible=True: aggregates whose bits depend on the pushes alone."""

from typing import Any

import numpy as np
import pytest

from collectives import Communicator
from collectives.errors import ConfigurationError
from collectives.kvstore import KVStore, create
from tests.reproducible_cases import contributions, model
from tests.test_kvstore import run_store

ROUNDS, COUNT = 3, 200


def _pushes(workers: int, dtype: str = "float32") -> list[list[np.ndarray]]:
    """Each round's pushes, one a worker: values whose sums depend on the order they are added in."""
    return [contributions(dtype, workers, COUNT, seed=40 + t, specials=False) for t in range(ROUNDS)]


@pytest.mark.parametrize("op", ["sum", "avg"])
@pytest.mark.parametrize(
    ("size", "dedicated", "collective"), [(2, None, True), (3, None, False), (4, 1, False)]
)
def test_a_sync_rounds_aggregate_is_the_reproducible_sum(
    size: int, dedicated: int | None, collective: bool, op: str
) -> None:
    workers = size - (dedicated or 0)
    pushes = _pushes(workers)

    def body(kv: KVStore, comm: Communicator) -> list[bytes]:
        kv.init("w", np.zeros(COUNT, np.float32))
        pulled = []
        for t in range(ROUNDS):
            kv.push("w", pushes[t][kv.rank])
            pulled.append(np.asarray(kv.pull("w")).tobytes())
        return pulled

    options: dict[str, Any] = {"mode": "sync", "servers": dedicated, "collective": collective, "op": op}
    results = [r for r in run_store(size, body, reproducible=True, **options) if r is not None]
    for t in range(ROUNDS):
        expected = model(pushes[t], "float32", divide_by=workers if op == "avg" else 1).tobytes()
        assert all(r[t] == expected for r in results), t


@pytest.mark.parametrize("mode", ["async", "ssp"])
@pytest.mark.parametrize(("size", "dedicated"), [(2, None), (3, 1)])
def test_the_value_after_every_push_does_not_depend_on_their_order(
    mode: str, size: int, dedicated: int | None
) -> None:
    workers = size - (dedicated or 0)
    pushes = _pushes(workers, "float64")
    start = contributions("float64", 1, COUNT, seed=39, specials=False)[0]

    def body(kv: KVStore, comm: Communicator) -> bytes:
        kv.init("w", start)
        for t in range(ROUNDS):
            kv.push("w", pushes[t][kv.rank], block=False)
            kv.clock()
        kv.barrier()
        return np.asarray(kv.pull("w")).tobytes()

    results = [
        r for r in run_store(size, body, mode=mode, servers=dedicated, reproducible=True) if r is not None
    ]
    every = [start] + [p for round_ in pushes for p in round_]
    assert all(r == model(every, "float64").tobytes() for r in results)


def test_reproducible_takes_sum_or_avg_only() -> None:
    with pytest.raises(ConfigurationError, match="reproducible"):
        create(comm=None, op="max", reproducible=True)
