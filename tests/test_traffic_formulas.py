"""Counted traffic by formula equals the count of the schedule, and explain at scale builds no schedule."""

import pytest

import collectives
from collectives.algorithms import ALGORITHMS, base, build_schedule, registry, schedule_traffic
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


def test_explain_at_four_thousand_ranks_builds_no_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    # its time is measured by `python -m bench plans`; here, the reason it is quick
    def refuse(*args: object) -> None:
        raise AssertionError(f"built a schedule: {args[:3]}")

    monkeypatch.setattr(registry, "_cached", refuse)
    explanation = collectives.explain("allreduce", 2**24, world_size=4096)
    assert explanation.choice is not None and len(explanation.candidates) >= 5
