"""Random calls under mpiexec at 2 and 3 ranks: threads on several communicators, interruptions, the store."""

import os
import subprocess

import pytest

from .mpirun import mpiexec, run_mpi

# $COLLECTIVES_FUZZ_SEED tries other sequences; CI runs these fixed ones
SEED = int(os.environ.get("COLLECTIVES_FUZZ_SEED", "20261123"))


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("ranks", [2, 3])
def test_random_calls_are_right_or_fail_cleanly_on_every_rank(ranks: int) -> None:
    try:
        result = run_mpi(ranks, ["-m", "tests.faults.fuzz_calls", str(SEED + ranks), "40"], timeout=240)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the fuzz run hung:\n{expired.output}")
    assert result.returncode == 0 and "OK" in result.stdout, result.stdout


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("ranks", [2, 3])
def test_random_pushes_and_pulls_on_the_store_equal_a_numpy_model(ranks: int) -> None:
    try:
        result = run_mpi(ranks, ["-m", "tests.faults.fuzz_store", str(SEED + ranks), "30"], timeout=120)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the store fuzz run hung:\n{expired.output}")
    assert result.returncode == 0 and "fuzz store: 30 steps, OK" in result.stdout, result.stdout
