"""examples/train.py under mpiexec: the optimizer, the backend and ps-sync print the same losses; ps-* run."""

import re
import subprocess

import pytest

from .mpirun import mpiexec, run_mpi

pytest.importorskip("torch", reason="the training example needs torch (pip install torch==2.13.0)")

TIMEOUT_S = 180  # one run; measured 5 s on 2 shared cores


def _run(mode: str, *options: str) -> str:
    args = ["examples/train.py", "--mode", mode, "--steps", "3", "--warmup", "0", "--width", "64", *options]
    try:
        finished = run_mpi(2, args, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"examples/train.py --mode {mode} hung; output so far:\n{expired.output}")
    assert finished.returncode == 0, finished.stdout
    assert re.search(rf"mode {mode}: 2 ranks, median step [\d.]+ ms over 3 steps", finished.stdout)
    return finished.stdout


def _losses(mode: str, *options: str) -> list[float]:
    return [float(loss) for loss in re.findall(r"  loss (\S+)", _run(mode, *options))]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_example_trains_alike_through_the_optimizer_and_the_backend() -> None:
    optimizer, backend = _losses("optimizer"), _losses("backend")
    assert len(optimizer) == 3
    assert backend == pytest.approx(optimizer, rel=1e-5)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_the_example_trains_alike_through_the_synchronous_key_value_store() -> None:
    optimizer, store = _losses("optimizer"), _losses("ps-sync")
    assert len(store) == 3
    assert store == pytest.approx(optimizer, rel=1e-6)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("mode", ["ps-async", "ps-ssp"])
def test_the_example_trains_through_the_asynchronous_stores_with_a_straggler(mode: str) -> None:
    output = _run(mode, "--staleness", "1", "--straggler-ms", "5", "--target-loss", "100")
    losses = [float(loss) for loss in re.findall(r"  loss (\S+)", output)]
    assert len(losses) == 3 and all(0 < loss < 10 for loss in losses)
    assert re.search(r"target loss 100.0 reached at step 0 after [\d.]+ s", output), output
