"""examples/train.py under mpiexec: the optimizer and the "collectives" backend print the same losses."""

import re
import subprocess

import pytest

from .mpirun import mpiexec, run_mpi

pytest.importorskip("torch", reason="the training example needs torch (pip install torch==2.13.0)")

TIMEOUT_S = 180  # one run; measured 5 s on 2 shared cores


def _losses(mode: str) -> list[float]:
    args = ["examples/train.py", "--mode", mode, "--steps", "3", "--warmup", "0", "--width", "64"]
    try:
        finished = run_mpi(2, args, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"examples/train.py --mode {mode} hung; output so far:\n{expired.output}")
    assert finished.returncode == 0, finished.stdout
    assert re.search(rf"mode {mode}: 2 ranks, median step [\d.]+ ms over 3 steps", finished.stdout)
    return [float(loss) for loss in re.findall(r"loss (\S+)", finished.stdout)]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_example_trains_alike_through_the_optimizer_and_the_backend() -> None:
    optimizer, backend = _losses("optimizer"), _losses("backend")
    assert len(optimizer) == 3
    assert backend == pytest.approx(optimizer, rel=1e-5)
