"""Which algorithms give the same bits as each other on random floats (see docs/determinism.md)."""

from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives.algorithms import ALGORITHMS
from collectives.selector import rejection_reasons
from tests.conftest import run_ranks

COUNT = 1003


def _inputs(world_size: int, count: int = COUNT) -> list[np.ndarray]:
    return [np.random.default_rng(7 + r).normal(size=count).astype(np.float32) for r in range(world_size)]


def _bits(collective: str, world_size: int, count: int = COUNT) -> dict[str, bytes]:
    """Each algorithm's result (every rank's, concatenated, for reduce_scatter); checks ranks and reruns."""
    xs = _inputs(world_size, count)
    found = {}
    for name, module in ALGORITHMS.items():
        if not hasattr(module, collective) or rejection_reasons(collective, name, world_size, count):
            continue

        def call(comm: C.Communicator, name: str = name) -> Any:
            return getattr(C, collective)(xs[comm.rank], algorithm=name, comm=comm)

        first, again = run_ranks(world_size, call), run_ranks(world_size, call)
        results = [r for r in first if r is not None]
        assert [r.tobytes() for r in results] == [r.tobytes() for r in again if r is not None], name
        if collective == "allreduce":
            assert all(r.tobytes() == results[0].tobytes() for r in results), f"{name}: ranks differ"
            results = results[:1]
        found[name] = b"".join(r.tobytes() for r in results)
    return found


def _rank_order_sum(xs: list[np.ndarray]) -> bytes:
    total = xs[0].copy()
    for x in xs[1:]:
        total += x
    return total.tobytes()


def test_on_two_ranks_every_allreduce_algorithm_gives_the_same_bits() -> None:
    bits = _bits("allreduce", 2)
    assert len(set(bits.values())) == 1, sorted(bits)


@pytest.mark.parametrize("world_size", [3, 4, 5, 6, 7, 8])
def test_butterfly_and_halving_doubling_agree_and_direct_sums_in_rank_order(world_size: int) -> None:
    bits = _bits("allreduce", world_size)
    assert bits["butterfly"] == bits["halving_doubling"]
    assert bits["direct"] == _rank_order_sum(_inputs(world_size))
    assert bits["ring"] != bits["direct"]  # so the comparisons above can fail


@pytest.mark.parametrize("world_size", [2, 3, 5])
def test_reduce_and_reduce_scatter_are_deterministic_for_every_algorithm(world_size: int) -> None:
    reduced = _bits("reduce", world_size)
    assert all(b == _rank_order_sum(_inputs(world_size)) for b in reduced.values()), sorted(reduced)
    _bits("reduce_scatter", world_size, COUNT * world_size)
