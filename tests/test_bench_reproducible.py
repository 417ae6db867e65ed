"""bench reproducible: its table under mpiexec, the add rate and the errors (no timing asserted)."""

import re

import pytest

from collectives.bench.reproducible import add_rate, errors

from .mpirun import mpiexec, run_mpi


def test_the_errors_are_measured_against_the_exact_sums() -> None:
    found = errors(terms=40, count=30)
    assert [row[0] for row in found] == ["float32", "float64"]
    for dtype, ours, pairwise, ours_right, pairwise_right in found:
        assert 0 <= ours < (2.0**-31 * 40 if dtype == "float32" else 2.0**-78 * 40), dtype  # the stated bound
        assert pairwise >= 0 and 0 <= ours_right <= 1 and 0 <= pairwise_right <= 1


def test_the_accumulators_rate_is_a_positive_number() -> None:
    assert add_rate(1 << 14, repeats=2) > 0


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("in_place", [False, True])
def test_the_table_has_a_row_per_size(in_place: bool) -> None:
    args = ["-m", "collectives", "bench", "reproducible", "-b", "8", "-e", "64", "-n", "2"]
    finished = run_mpi(2, args + (["--in-place"] if in_place else []), timeout=120)
    assert finished.returncode == 0, finished.stdout
    assert ("avg in place" in finished.stdout) == in_place, finished.stdout
    rows = re.findall(r"^\s+(\d+)\s+[\d.]+\s+[\d.]+\s+[\d.]+$", finished.stdout, re.MULTILINE)
    assert rows == ["8", "64"], finished.stdout
