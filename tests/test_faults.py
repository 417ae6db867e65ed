"""A rank that dies or hangs in the middle of a collective ends the job within a bound, never hangs it."""

import subprocess
import time

import pytest

from tests.mpirun import mpiexec, run_mpi

BOUND_S = 60  # the job must be over by then; the survivors' own timeout is 5 s


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("algorithm", ["ring", "shared_memory"])
@pytest.mark.parametrize("how", ["exit", "kill", "hang"])
def test_a_rank_lost_mid_collective_ends_the_job(how: str, algorithm: str) -> None:
    started = time.monotonic()
    try:
        finished = run_mpi(3, ["-m", "tests.faults.die_mid_collective", how, algorithm], timeout=BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung after a rank was lost ({how}); output:\n{expired.output}")
    took = time.monotonic() - started
    output = finished.stdout
    assert finished.returncode != 0, output
    assert f"rank 2: dying ({how})" in output
    assert "completed without rank 2" not in output
    if how == "hang":
        # nothing died, so only the survivors' timeout (5 s) can end it. The first survivor to
        # raise ends the job, and the launcher may drop the tail of the others' output then (even
        # its own error's last line), so the time it took is the proof; the rank and step named
        # vary on a loaded machine; the barrier's message is checked in tests/test_shared_memory.py
        assert took >= 5.0 and "for rank 2" in output, output
    print(f"{how} in {algorithm}: the job ended in {took:.1f} s with exit status {finished.returncode}")


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("how", ["exit", "exit0", "kill"])
def test_a_rank_lost_mid_collective_ends_the_job_without_a_timeout(how: str) -> None:
    """No watchdog deadline (timeout 0): MPI's own error on the survivors, or the launcher, ends the job."""
    started = time.monotonic()
    try:
        finished = run_mpi(3, ["-m", "tests.faults.die_mid_collective", how, "ring", "0"], timeout=BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung after a rank was lost ({how}) with no timeout; output:\n{expired.output}")
    output = finished.stdout
    if how != "exit0":
        # a rank that leaves with status 0 and no MPI_Finalize makes MPICH's launcher SIGKILL the
        # survivors, waiting for it with no deadline; the job's status is then 0 or 9 by who ends first
        assert finished.returncode != 0, output
    assert "completed without rank 2" not in output
    # a survivor that saw MPI's error says which call and peer, as the library's error
    assert "See the MPI_ERROR field" not in output, output
    print(f"{how} without a timeout: the job ended in {time.monotonic() - started:.1f} s")
