"""Two threads calling at once on one communicator or one store, under mpiexec: never a wrong result."""

import subprocess

import pytest

from tests.mpirun import mpiexec, records, run_mpi

TIMEOUT_S = 180
RUNS = 180  # a run takes about 15 ms; before the claim was atomic, one in 60 to 180 gave wrong sums


def _race(mode: str, runs: int, clean_exit: bool = True) -> list[dict[str, object]]:
    try:
        finished = run_mpi(2, ["-m", "tests.threads_race", mode, str(runs)], timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the race hung: no end after {TIMEOUT_S} s; output:\n{expired.output}")
    # the store's close after a timed-out round may still crash at exit (issue 30, item 4, fixed apart)
    assert finished.returncode == 0 or not clean_exit, finished.stdout
    results = records(finished.stdout, "RESULT ")
    assert len(results) == 2, finished.stdout
    return results


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_two_threads_allreduce_at_once_never_get_a_wrong_sum() -> None:
    for seen in _race("allreduce", RUNS):
        assert seen["wrong"] == [], seen["wrong"]
        # both kinds of outcome happened, so the race was run, not dodged
        assert seen["right"] and seen["refused"], seen


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_two_threads_pushpull_at_once_never_mix_keys() -> None:
    for seen in _race("store", 30, clean_exit=False):
        assert seen["wrong"] == [], seen["wrong"]
        assert seen["right"] and seen["refused"], seen
