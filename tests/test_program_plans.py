"""The call path plans from a rank's program alone: no global schedule, the same plan, bounded memos."""

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import collectives as C
from collectives import algorithms, execute
from collectives.algorithms import ALGORITHMS, base, build_schedule, rank_program, registry
from collectives.memo import Bounded
from collectives.schedule import Schedule
from collectives.specs import COLLECTIVES, get_spec

Ranks = Callable[..., list[Any]]

COUNT = 23  # not a multiple of any world size below, so shares are uneven


def _algorithms(collective: str) -> list[str]:
    return [name for name, module in ALGORITHMS.items() if base.implements(module, collective)]


def _refuse(*args: object, **kwargs: object) -> None:
    raise AssertionError("the call path built a global schedule")


def _data(rank: int, count: int) -> np.ndarray:
    return ((np.arange(count) * (rank + 3)) % 101).astype(np.float64)  # integers: every sum is exact


def _call(comm: C.Communicator, collective: str, algorithm: str, in_place: bool) -> bool:
    p, r = comm.size, comm.rank
    if collective == "allreduce":
        x = _data(r, COUNT)
        want = sum(_data(q, COUNT) for q in range(p))
        got = C.allreduce(x, out=x if in_place else np.empty_like(x), algorithm=algorithm, comm=comm)
    elif collective == "reduce_scatter":
        x = _data(r, COUNT * p)
        want = sum(_data(q, COUNT * p) for q in range(p))[r * COUNT : (r + 1) * COUNT]
        out = None if in_place else np.empty(COUNT)
        got = C.reduce_scatter(x, out=out, algorithm=algorithm, comm=comm)
    elif collective == "allgather":
        x = _data(r, COUNT)
        want = np.concatenate([_data(q, COUNT) for q in range(p)])
        out = None if in_place else np.empty(p * COUNT)
        got = C.allgather(x, out=out, algorithm=algorithm, comm=comm)
    else:
        root = p - 1
        x = _data(r, COUNT)
        want = _data(root, COUNT)
        got = C.broadcast(x, root, out=x if in_place else np.empty_like(x), algorithm=algorithm, comm=comm)
    return bool(np.array_equal(got, want))


@pytest.mark.parametrize("collective", ["allreduce", "reduce_scatter", "allgather", "broadcast"])
@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_the_call_path_builds_no_global_schedule(
    ranks: Ranks, monkeypatch: pytest.MonkeyPatch, collective: str, world_size: int
) -> None:
    registry._programs.cache_clear()  # every program built afresh, from the rank number
    monkeypatch.setattr(registry, "_cached", _refuse)
    monkeypatch.setattr(Schedule, "__post_init__", _refuse)

    def run(comm: C.Communicator) -> list[bool]:
        return [
            _call(comm, collective, algorithm, in_place)
            for algorithm in _algorithms(collective)
            for in_place in (True, False)
            for _ in range(2)  # the repeated call too
        ]

    results = ranks(world_size, run)
    assert all(all(rank_results) for rank_results in results), results


@pytest.mark.parametrize("collective", [c for c in COLLECTIVES if get_spec(c).carries_data])
def test_a_plan_from_the_program_is_the_plan_from_the_schedule(collective: str) -> None:
    rooted = get_spec(collective).rooted
    for world_size in (1, 2, 3, 4, 5, 7, 8):
        count = world_size * 13 if collective == "alltoall" else (1 << 22) + 3  # the trees pipeline it
        for algorithm in _algorithms(collective):
            for root in sorted({0, world_size - 1}) if rooted else [0]:
                schedule = build_schedule(collective, algorithm, world_size, count, root=root)
                for rank in range(world_size):
                    program = rank_program(collective, algorithm, world_size, count, root=root, rank=rank)
                    for segment, separate in ((0, False), (1 << 20, True), (1 << 19, False)):
                        assert execute.program_plan(program, segment, separate) == execute.plan(
                            schedule, rank, segment, separate
                        ), (collective, algorithm, world_size, root, rank, segment, separate)


def test_a_plan_is_memoized_by_its_program() -> None:
    program = rank_program("allreduce", "ring", 6, 1000, rank=2)
    assert execute.program_plan(program, 5, True) is execute.program_plan(program, 5, True)
    assert execute.program_plan(program, 5, True) is not execute.program_plan(program, 5, False)


def test_a_rank_plan_at_thousands_of_ranks_is_built_without_the_schedule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(registry, "_cached", _refuse)
    program = rank_program("allreduce", "ring", 4096, 1 << 20, rank=17)
    made = execute.program_plan(program, 1 << 18, True)
    assert len(made.steps) == 2 * 4095
    assert made.size < 10 * len(made.steps) + 4096


def test_a_bounded_memo_keeps_no_more_than_its_budget() -> None:
    memo: Bounded[int, list[int]] = Bounded(entries=3, budget=10, weigh=len)
    for key in range(20):
        assert memo.put(key, [0] * (key % 5)) == [0] * (key % 5)
        assert len(memo) <= 3 and memo.weight <= 10
    memo.put(99, [0] * 11)  # heavier than the budget: returned, not kept
    assert memo.get(99) is None and memo.weight <= 10
    memo.cache_clear()
    assert len(memo) == 0 and memo.weight == 0


def test_the_memos_of_the_call_path_stay_flat_at_thousands_of_ranks() -> None:
    registry._programs.cache_clear()
    for count in range(1000, 1040):  # forty shapes of a ring allreduce at 4,096 ranks
        execute.program_plan(rank_program("allreduce", "ring", 4096, count, rank=5), 1 << 18, False)
    assert registry._programs.weight <= algorithms.PROGRAMS_BUDGET
    assert execute._programs_planned.weight <= execute.PLANS_BUDGET
    assert len(registry._programs) < 40


def test_the_repeat_call_cache_holds_plans_within_the_budget() -> None:
    from collectives.ops import get_op
    from collectives.repeats import Repeat, RepeatedAllreduce

    kept: dict[Any, Any] = {}
    heavy = execute.program_plan(rank_program("allreduce", "ring", 4096, 1 << 20, rank=3), 1 << 18, False)
    for key in range(3 * execute.PLANS_BUDGET // heavy.size):
        ready = RepeatedAllreduce(backend=None, op=get_op("sum"), guard=None, shape=(), plan=heavy)  # type: ignore[arg-type]
        Repeat(kept, (key,)).keep(ready)
        assert sum(p.plan.size for p in kept.values()) <= execute.PLANS_BUDGET
        assert kept[(key,)] is ready  # the latest is always kept
