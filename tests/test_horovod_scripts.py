"""Runs tests/horovod_scripts (the calls of Horovod's PyTorch examples, in order) under mpiexec -n 2."""

import subprocess

import pytest

from tests.mpirun import mpiexec, run_mpi

pytest.importorskip("torch", reason="collectives.horovod needs torch (pip install torch==2.13.0)")

TIMEOUT_S = 180  # the whole run; measured about 20 s on 2 busy cores


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize(
    ("script", "args", "expected"),
    [
        ("synthetic_benchmark.py", ["--fp16-allreduce"], "parameters equal on every rank"),
        (
            "mnist.py",
            ["--gradient-predivide-factor", "2", "--synchronize-first"],
            "metrics averaged / parameters equal",
        ),
    ],
)
def test_horovod_example_calls_run_under_mpiexec(script: str, args: list[str], expected: str) -> None:
    command = ["-W", "error::DeprecationWarning", f"tests/horovod_scripts/{script}", *args]
    try:
        finished = run_mpi(2, command, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{script} hung: no end after {TIMEOUT_S} s; output so far:\n{expired.output}")
    output = finished.stdout
    assert finished.returncode == 0, f"{script} failed (exit {finished.returncode}):\n{output}"
    assert expected in output, output
