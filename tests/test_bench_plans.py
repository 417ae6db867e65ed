"""``python -m bench plans`` runs, small, and measures what it says."""

import pytest

from collectives.bench.plans import ALGORITHMS_TIMED, main, measure, measure_plan


def test_the_plans_benchmark_runs_small(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["-n", "64", "-c", "100000", "-r", "5"]) == 0
    out = capsys.readouterr().out
    assert "rank 5's plan" in out and "explain(allreduce, 100000, world_size=64)" in out
    assert "plan(ms)" in out
    for name in ALGORITHMS_TIMED:
        assert name in out


def test_a_plan_is_measured_with_its_steps_and_memory() -> None:
    seconds, peak, steps = measure("ring", 64, 1000, 3)
    assert seconds > 0 and peak > 0
    assert steps == 2 * (64 - 1)


def test_the_executors_plan_is_measured_from_the_program() -> None:
    seconds, peak, messages = measure_plan("ring", 64, 1000, 3)
    assert seconds > 0 and peak > 0
    assert messages == 2 * 2 * (64 - 1)  # a send and a receive per step
