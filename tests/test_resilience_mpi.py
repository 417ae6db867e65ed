"""Under MPICH: an injected fault ends the job naming the rank; a relaunch resumes bitwise; replicas hold."""

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from .mpirun import BENCH, mpiexec, run_mpi

BOUND_S = 120  # one job; the survivors' own timeout is 5 s

pytestmark = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")


def _run(ranks: int, args: list[str], monkeypatch: pytest.MonkeyPatch, fault: str | None) -> tuple[int, str]:
    with monkeypatch.context() as env:
        if fault is None:
            env.delenv("COLLECTIVES_FAULT", raising=False)
        else:
            env.setenv("COLLECTIVES_FAULT", fault)
        try:
            finished = run_mpi(ranks, args, timeout=BOUND_S)
        except subprocess.TimeoutExpired as expired:
            pytest.fail(f"the job hung ({fault=}); output so far:\n{expired.output}")
    return finished.returncode, finished.stdout


@pytest.mark.parametrize("how", ["exit", "kill", "hang", "kill:0"])
def test_an_injected_fault_ends_the_job_naming_the_rank(how: str, monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = _run(3, ["-m", "tests.faults.injected", "calls"], monkeypatch, f"1:4:{how}")
    assert status != 0, output
    # kill:0: in the call, at its first barrier of shared memory (the ranks' small allreduce path)
    where = "allreduce #4, step 0" if how == "kill:0" else "allreduce #4"
    said = f"collectives: rank 1: injected fault 1:4:{how} (COLLECTIVES_FAULT): {how[:4]} at {where}"
    assert said in output
    assert "rank 1: all calls completed" not in output
    if how == "hang":  # only the survivors' timeout ends it: they name the rank they wait for
        assert "for rank 1" in output, output


def test_unarmed_the_same_job_completes(monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = _run(2, ["-m", "tests.faults.injected", "calls"], monkeypatch, None)
    assert status == 0, output
    assert "rank 1: all calls completed" in output


def test_in_memory_checkpoints_keep_each_state_on_its_next_ranks(monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = _run(3, ["-m", "tests.faults.injected", "replicas"], monkeypatch, None)
    assert status == 0, output
    assert "replicas ok on 3 ranks" in output


torch_needed = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None,
    reason="the training example needs torch (pip install torch==2.13.0)",
)


def _train(
    mode: str, directory: Path | None, monkeypatch: pytest.MonkeyPatch, fault: str | None = None
) -> tuple[int, str]:
    args = ["examples/train.py", "--mode", mode, "--steps", "6", "--warmup", "0", "--width", "32"]
    if directory is not None:
        args += ["--checkpoint-dir", str(directory), "--checkpoint-every", "2"]
    return _run(2, args, monkeypatch, fault)


def _digest(output: str) -> str:
    found = re.search(r"parameters sha256 ([0-9a-f]{64})", output)
    assert found, output
    return found.group(1)


def _fails(mode: str, fault: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    status, output = _train(mode, tmp_path, monkeypatch, fault)
    assert status != 0 and "collectives: rank 1: injected fault" in output, output
    assert "parameters sha256" not in output
    versions = sorted(p.name for p in tmp_path.iterdir() if (p / "manifest.json").exists())
    assert versions == ["v00000002"], versions  # the fault came before the second checkpoint was whole


def _resumes_bitwise(mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, unfailed: str) -> str:
    status, output = _train(mode, tmp_path, monkeypatch)
    assert status == 0, output
    assert f"resumed from the checkpoint of step 2 in {tmp_path}" in output
    assert _digest(output) == unfailed
    return output


@torch_needed
def test_a_run_killed_mid_checkpoint_relaunched_resumes_from_the_one_before_and_ends_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, output = _train("optimizer", None, monkeypatch)
    assert status == 0, output
    # killed halfway through writing its file of the second checkpoint (step 4): only a temporary
    # file of it is left, and the relaunch resumes from the first (step 2)
    _fails("optimizer", "1:checkpoint:1:kill", tmp_path, monkeypatch)
    assert any(p.name.startswith(".rank-1.state.") for p in (tmp_path / "v00000004").iterdir())
    _resumes_bitwise("optimizer", tmp_path, monkeypatch, _digest(output))
    assert not any(p.name.startswith(".") for p in (tmp_path / "v00000004").iterdir())  # cleaned up


@torch_needed
def test_a_killed_store_run_relaunched_resumes_its_servers_and_ends_bitwise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    status, output = _train("ps-sync", None, monkeypatch)
    assert status == 0, output
    # the process's calls: 1 to load, then 12 a step (a reduce-scatter and an all-gather per
    # parameter) and 2 a checkpoint: call 40 is in step 3, after the checkpoint of step 2
    _fails("ps-sync", "1:40:exit", tmp_path, monkeypatch)
    _resumes_bitwise("ps-sync", tmp_path, monkeypatch, _digest(output))


def test_the_checkpoint_bench_prints_a_row_a_size(monkeypatch: pytest.MonkeyPatch) -> None:
    args = [*BENCH, "checkpoint", "-b", "1K", "-e", "8K", "-n", "1"]
    status, output = _run(2, args, monkeypatch, None)
    assert status == 0, output
    rows = [line.split() for line in output.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["1024", "8192"] and all(len(row) == 7 for row in rows), output
