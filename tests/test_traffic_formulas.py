"""Counted traffic by formula equals the count of the schedule, and explain is quick at scale."""

import time

import pytest

import collectives
from collectives.algorithms import ALGORITHMS, base, build_schedule, schedule_traffic
from collectives.specs import COLLECTIVES, get_spec
from collectives.topology.cost_model import traffic

from .strategies import WORLD_SIZES, edge_counts

FORMULAS = [
    (name, c)
    for name, module in ALGORITHMS.items()
    for c in COLLECTIVES
    if base.implements(module, c)
    and (formula := base.traffic_formula(module)) is not None
    and formula(c, 4, 8) is not None
]


def test_the_allreduces_the_selector_weighs_at_scale_have_formulas() -> None:
    expected = {"ring", "tree", "double_tree", "butterfly", "halving_doubling", "multi_ring", "hierarchical"}
    assert expected | {"direct", "hierarchical_shared_memory"} <= {n for n, c in FORMULAS if c == "allreduce"}


@pytest.mark.parametrize(("algorithm", "collective"), FORMULAS)
def test_the_formula_counts_what_the_schedule_does(algorithm: str, collective: str) -> None:
    formula = base.traffic_formula(ALGORITHMS[algorithm])
    assert formula is not None
    carries = get_spec(collective).carries_data
    for world_size in WORLD_SIZES:
        counts = (*edge_counts(world_size), 1000, (1 << 22) + 3) if carries else (0,)
        for count in counts:
            schedule = build_schedule(collective, algorithm, world_size, count)
            expected = (schedule.name, traffic(schedule))
            assert formula(collective, world_size, count) == expected, (algorithm, world_size, count)


def test_the_entry_point_builds_where_there_is_no_formula() -> None:
    schedule = build_schedule("alltoall", "direct", 4, 8)
    assert schedule_traffic("alltoall", "direct", 4, 8) == (schedule.name, traffic(schedule))
    with pytest.raises(ValueError):
        schedule_traffic("alltoall", "direct", 4, 7)


def test_explain_at_four_thousand_ranks_takes_under_a_tenth_of_a_second() -> None:
    start = time.perf_counter()
    explanation = collectives.explain("allreduce", 2**24, world_size=4096)
    elapsed = time.perf_counter() - start
    assert explanation.choice is not None
    assert elapsed < 0.1, f"explain took {elapsed * 1e3:.0f} ms"
