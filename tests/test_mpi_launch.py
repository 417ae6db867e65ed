"""Runs the MPI suite (tests/mpi) under mpiexec with 1 to 5 ranks, each run time-bounded."""

import os
import re
import subprocess

import pytest

from collectives import engine
from tests.mpirun import mpiexec, run_mpi

TIMEOUT_S = 240  # the whole run; measured 7 s at 1 rank to 53 s at 5 ranks on 2 busy cores
TEST_TIMEOUT_S = 120  # one test; a hung rank then exits with its stack, and mpiexec ends the job

MPI_PYTEST = [
    "-m", "pytest", "tests/mpi", "--with-mpi", "-q", "-p", "no:cacheprovider", "-x",
    # a thread timer, as a signal cannot interrupt a rank blocked inside MPI
    f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=thread",
]  # fmt: skip


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize(
    ("ranks", "compiled"),
    [
        (1, True),
        (2, True),
        (3, True),
        (4, True),
        (5, True),
        # the Python path too where the compiled engine runs (elsewhere the runs above take it)
        pytest.param(
            2,
            False,
            id="2-python-path",
            marks=pytest.mark.skipif(not engine.compiled(), reason="the runs above take the Python path"),
        ),
    ],
    ids=lambda value: str(value) if isinstance(value, int) else None,
)
def test_mpi_suite(ranks: int, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:
        monkeypatch.setenv("COLLECTIVES_COMPILED", "0")
    if ranks > (os.cpu_count() or 1) and "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in os.environ:
        # oversubscribed, MPICH's busy polling starves the ranks it waits for; yielding the
        # core while waiting makes the run about twice as fast
        monkeypatch.setenv("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    try:
        finished = run_mpi(ranks, MPI_PYTEST, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"the MPI suite hung at {ranks} ranks: no end after {TIMEOUT_S} s; "
            f"output so far:\n{expired.output}"
        )
    output, code = finished.stdout, finished.returncode
    assert code == 0, f"the MPI suite failed at {ranks} ranks (exit {code}):\n{output}"
    # every rank prints a summary; a collection error or an empty run must not pass quietly
    passed = [int(n) for n in re.findall(r"(\d+) passed", output)]
    assert passed and min(passed) > 0, f"the MPI suite ran no tests at {ranks} ranks:\n{output}"
