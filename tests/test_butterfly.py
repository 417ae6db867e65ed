"""The butterflies: verified for every world size and count at their documented cost; run on loopback."""

from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

import collectives as C
from collectives import Communicator, ScheduleError
from collectives.algorithms import build_schedule, butterfly, halving_doubling
from collectives.chunking import even_split
from collectives.schedule import Schedule, Step, Transfer
from collectives.simulate import simulate
from collectives.specs import get_spec

from .conftest import run_ranks
from .strategies import WORLD_SIZES, edge_counts, shares


def _name(module: ModuleType) -> str:
    return module.__name__.rsplit(".", 1)[-1]


BUILT = [
    (butterfly, "allreduce"),
    (butterfly, "reduce_scatter"),
    (butterfly, "allgather"),
    (halving_doubling, "allreduce"),
]
BUILT_IDS = [f"{collective}-{_name(module)}" for module, collective in BUILT]
LOOPBACK_SIZES = [1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 16]


def _base(world_size: int) -> int:
    return 1 << (world_size.bit_length() - 1)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize(("module", "collective"), BUILT, ids=BUILT_IDS)
def test_meets_the_contract_at_its_documented_cost(
    module: ModuleType, collective: str, world_size: int
) -> None:
    for count in edge_counts(world_size):
        schedule = build_schedule(collective, _name(module), world_size, count)
        assert schedule.name == f"{collective}-{_name(module)}(n={world_size})"
        result = simulate(schedule)
        expected = module.cost(collective, even_split(count, world_size))
        assert (result.steps, result.elements_sent) == expected, (collective, world_size, count)


@pytest.mark.parametrize("world_size", [1, 2, 4, 8, 16, 32])
def test_a_power_of_two_moves_the_textbook_amounts(world_size: int) -> None:
    p, count = world_size, 12 * world_size
    log = p.bit_length() - 1
    doubling = simulate(butterfly.allreduce(p, count))
    assert (doubling.steps, set(doubling.elements_sent)) == (log, {log * count})
    rabenseifner = simulate(halving_doubling.allreduce(p, count))
    assert (rabenseifner.steps, set(rabenseifner.elements_sent)) == (2 * log, {2 * (p - 1) * count // p})
    for collective in ("reduce_scatter", "allgather"):
        result = simulate(build_schedule(collective, "butterfly", p, count))
        assert (result.steps, set(result.elements_sent)) == (log, {(p - 1) * count // p})


@pytest.mark.parametrize("world_size", [3, 5, 6, 7, 12, 24, 33])
def test_other_world_sizes_fold_into_a_power_of_two_in_two_more_steps(world_size: int) -> None:
    base, count = _base(world_size), 10 * world_size
    log = base.bit_length() - 1
    for schedule in (butterfly.allreduce(world_size, count), halving_doubling.allreduce(world_size, count)):
        first, last = schedule.steps[0], schedule.steps[-1]
        extras = range(base, world_size)
        # extra rank e hands its whole buffer to rank e - P', and gets the result back at the end
        assert {(t.src, t.dst) for t in first.transfers} == {(e, e - base) for e in extras}
        assert all(t.reduce for t in first.transfers)
        assert {(t.src, t.dst) for t in last.transfers} == {(e - base, e) for e in extras}
        assert not any(t.reduce for t in last.transfers)
        result = simulate(schedule)
        assert all(result.elements_sent[e] == count for e in extras)
    assert len(butterfly.allreduce(world_size, count).steps) == log + 2
    assert len(halving_doubling.allreduce(world_size, count).steps) == 2 * log + 2


@pytest.mark.parametrize(("module", "collective"), BUILT, ids=BUILT_IDS)
def test_peers_differ_in_one_bit_or_are_fold_partners(module: ModuleType, collective: str) -> None:
    for world_size in (8, 13):
        base = _base(world_size)
        for step in build_schedule(collective, _name(module), world_size, 50).steps:
            for t in step.transfers:
                low, high = sorted((t.src, t.dst))
                assert high - low == base or (high < base and (low ^ high).bit_count() == 1), t


@settings(max_examples=150, deadline=None)
@given(shares())
def test_unequal_shares_meet_the_contract(counts: tuple[int, ...]) -> None:
    for collective in ("reduce_scatter", "allgather"):
        schedule = build_schedule(collective, "butterfly", len(counts), sum(counts), counts)
        result = simulate(schedule)
        assert get_spec(collective).shares(schedule) == counts
        assert schedule.chunk_owner == tuple(range(len(counts)))
        assert (result.steps, result.elements_sent) == butterfly.cost(collective, counts)


def test_schedules_survive_a_json_round_trip() -> None:
    for module, collective in BUILT:
        schedule = build_schedule(collective, _name(module), 6, 17)
        assert Schedule.from_json(schedule.to_json()) == schedule


def test_cost_refuses_collectives_the_module_has_not() -> None:
    with pytest.raises(ValueError, match="the butterfly has no 'broadcast'"):
        butterfly.cost("broadcast", (1, 1))
    with pytest.raises(ValueError, match="halving_doubling has no 'allgather'"):
        halving_doubling.cost("allgather", (1, 1))


def _replace_step(schedule: Schedule, index: int, transfers: list[Transfer]) -> Schedule:
    steps = list(schedule.steps)
    steps[index] = Step(transfers)
    return replace(schedule, steps=tuple(steps))


def test_a_missing_exchange_leaves_both_peers_short() -> None:
    schedule = butterfly.allreduce(4, 8)  # peers 2 apart, then 1 apart
    last = [t for t in schedule.steps[-1].transfers if t.src != 1]  # rank 1 -> 0 lost
    with pytest.raises(
        ScheduleError, match=r"rank 0 ends with chunk 0 holding contributions of ranks \{0, 2\}"
    ):
        simulate(_replace_step(schedule, -1, last))


def test_copying_where_halving_must_reduce_is_caught() -> None:
    schedule = butterfly.reduce_scatter((2, 2, 2, 2))
    copied = [replace(t, reduce=False) if t.src == 2 else t for t in schedule.steps[0].transfers]
    with pytest.raises(
        ScheduleError, match=r"rank 0 ends with chunk 0 holding contributions of ranks \{1, 2, 3\}"
    ):
        simulate(_replace_step(schedule, 0, copied))


def test_folding_in_twice_counts_an_extra_rank_twice() -> None:
    schedule = halving_doubling.allreduce(5, 10)
    twice = replace(schedule, steps=(schedule.steps[0], *schedule.steps))
    with pytest.raises(ScheduleError, match=r"rank 0 reduces chunk 0 twice: contributions of ranks \{4\}"):
        simulate(twice)


def test_folding_out_too_early_is_caught() -> None:
    schedule = halving_doubling.allreduce(5, 10)
    early = replace(schedule, steps=(schedule.steps[0], schedule.steps[-1], *schedule.steps[1:-1]))
    with pytest.raises(
        ScheduleError, match=r"rank 4 ends with chunk 0 holding contributions of ranks \{0, 4\}"
    ):
        simulate(early)


def test_a_doubling_step_may_not_overwrite_what_it_sends() -> None:
    schedule = butterfly.allgather((1, 1, 1, 1))
    # rank 1 would receive rank 0's chunk into chunk 1, which it sends to rank 0 in the same step
    clash = [*schedule.steps[0].transfers, Transfer(0, 1, 0, dst_chunk=1)]
    with pytest.raises(ScheduleError, match="rank 1 overwrites chunk 1 while also receiving or sending it"):
        _replace_step(schedule, 0, clash)


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _random(dtype: str, world_size: int, count: int) -> list[np.ndarray]:
    rng = np.random.default_rng(world_size * 1000 + count)
    return [rng.standard_normal(count).astype(dtype) for _ in range(world_size)]


@pytest.mark.parametrize("world_size", LOOPBACK_SIZES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_random_floats_give_the_same_bits_everywhere(dtype: str, world_size: int) -> None:
    count = 3 * world_size + 2
    inputs = _random(dtype, world_size, count)
    shares_ = even_split(count, world_size)
    starts = np.cumsum((0, *shares_))

    def run(comm: Communicator) -> tuple[np.ndarray, ...]:
        x = inputs[comm.rank]
        return (
            C.allreduce(x, algorithm="butterfly", comm=comm),
            C.allreduce(x, algorithm="halving_doubling", comm=comm),
            C.reduce_scatter(x, counts=shares_, algorithm="butterfly", comm=comm),
            C.allreduce(x, algorithm="ring", comm=comm),
        )

    results = run_ranks(world_size, run)
    reference = results[0][0]
    exact = np.sum(np.stack(inputs).astype(np.float64), axis=0)
    assert np.allclose(reference, exact, rtol=1e-4 if dtype == "float32" else 1e-12, atol=1e-5)
    for rank, (doubling, rabenseifner, mine, ring) in enumerate(results):
        # one reduction order for all three, so one set of bits
        assert _same_bits(doubling, reference), rank
        assert _same_bits(rabenseifner, reference), rank
        assert _same_bits(mine, reference[starts[rank] : starts[rank + 1]]), rank
        # the ring adds in another order once there are three terms
        assert _same_bits(ring, reference) or world_size > 2, rank


@pytest.mark.parametrize("world_size", LOOPBACK_SIZES)
def test_integers_are_exact_in_place_and_out_of_place(world_size: int) -> None:
    for count in (0, 1, world_size - 1, world_size + 1, 5 * world_size + 3):
        rng = np.random.default_rng(count)
        inputs = [rng.integers(-1000, 1000, count).astype(np.int64) for _ in range(world_size)]
        expected = np.sum(np.stack(inputs), axis=0) if count else np.zeros(0, np.int64)
        counts = [int(c) for c in rng.multinomial(count, [1 / world_size] * world_size)]  # unequal
        starts = np.cumsum((0, *counts))
        gathered = np.concatenate([inputs[r][: counts[r]] for r in range(world_size)])

        def run(comm: Communicator, xs: list[np.ndarray] = inputs, cs: list[int] = counts) -> list[Any]:
            x = xs[comm.rank]
            out: list[Any] = []
            for algorithm in ("butterfly", "halving_doubling"):
                in_place = x.copy()
                C.allreduce(in_place, out=in_place, algorithm=algorithm, comm=comm)
                out += [C.allreduce(x, algorithm=algorithm, comm=comm), in_place]
            out.append(C.reduce_scatter(x, counts=cs, algorithm="butterfly", comm=comm))
            out.append(C.allgather(x[: cs[comm.rank]], counts=cs, algorithm="butterfly", comm=comm))
            return out

        for rank, (*allreduces, mine, all_of_them) in enumerate(run_ranks(world_size, run)):
            assert all(_same_bits(r, expected) for r in allreduces), (world_size, count, rank)
            assert _same_bits(mine, expected[starts[rank] : starts[rank + 1]]), (world_size, count, rank)
            assert _same_bits(all_of_them, gathered), (world_size, count, rank)


@pytest.mark.parametrize("op", ["prod", "min", "max", "avg", "bxor"])
def test_every_op(op: str) -> None:
    world_size, count = 6, 11
    dtype = "int32" if op == "bxor" else "float64"
    inputs = [np.random.default_rng(r).integers(1, 4, count).astype(dtype) for r in range(world_size)]
    combine: Callable[..., np.ndarray] = {
        "prod": np.prod,
        "min": np.min,
        "max": np.max,
        "avg": np.mean,
        "bxor": np.bitwise_xor.reduce,
    }[op]
    expected = combine(np.stack(inputs), axis=0).astype(dtype)
    for algorithm in ("butterfly", "halving_doubling"):
        results = run_ranks(
            world_size, lambda comm, a=algorithm: C.allreduce(inputs[comm.rank], op, algorithm=a, comm=comm)
        )
        assert all(np.allclose(r, expected, rtol=1e-12) for r in results), (algorithm, results, expected)


def test_nan_payloads_agree_between_recursive_doubling_peers() -> None:
    # peers once computed a + b and b + a, keeping different NaNs (issue 19); the lower rank's goes first
    nan = np.array([np.nan], np.float32)
    inputs = [nan, -nan]
    doubling = run_ranks(2, lambda comm: C.allreduce(inputs[comm.rank], algorithm="butterfly", comm=comm))
    assert all(np.isnan(r).all() for r in doubling)
    assert _same_bits(doubling[0], doubling[1])
    copied = run_ranks(
        2, lambda comm: C.allreduce(inputs[comm.rank], algorithm="halving_doubling", comm=comm)
    )
    assert _same_bits(copied[0], copied[1]) and np.isnan(copied[0]).all()
