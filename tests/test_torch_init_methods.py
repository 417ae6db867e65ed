"""new_group with the collectives backend under torch's own init methods (env://, file://), under mpiexec."""

import subprocess

import pytest

pytest.importorskip("torch", reason="the torch integration needs torch (pip install torch==2.13.0)")

from tests.mpirun import mpiexec, records, run_mpi

TIMEOUT_S = 120  # measured 14 s on 2 busy cores; a rank left waiting errs after the groups' 20 s


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("method", ["env", "file"])
def test_new_group_for_members_and_others_as_first_group_and_later(method: str) -> None:
    try:
        done = run_mpi(2, ["-m", "tests.torch_init_methods", method], timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{method}:// hung: no end after {TIMEOUT_S} s; output so far:\n{expired.output}")
    found = {record["rank"]: record["problems"] for record in records(done.stdout, "RESULT ")}
    assert sorted(found) == [0, 1], f"not every rank reported (exit {done.returncode}):\n{done.stdout}"
    assert found == {0: [], 1: []}, found
    assert done.returncode == 0, done.stdout
