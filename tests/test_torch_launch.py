"""torchrun instead of mpiexec: refused at once, naming the mpiexec line to use, never N lone jobs."""

import os
import subprocess
import sys

import pytest

from tests.mpirun import ROOT

pytest.importorskip("torch")

# what torchrun gives each of its processes: an MPI singleton told it is one of several
_SCRIPT = """
import torch.distributed as dist
import collectives.torch_integration
dist.init_process_group("collectives", init_method="mpi://")
print("trained alone")
"""


def _run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "MPI_"))
    }
    return subprocess.run(
        [sys.executable, "-c", _SCRIPT, *args], cwd=ROOT, env={**environment, **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_torchrun_process_is_told_the_mpiexec_line_instead_of_training_alone() -> None:
    done = _run(
        {"TORCHELASTIC_RUN_ID": "none", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "RANK": "1"},
        "--lr",
        "0.1",
    )
    assert done.returncode != 0 and "trained alone" not in done.stdout
    assert "torchrun started 4 processes (WORLD_SIZE), but MPI sees 1" in done.stderr, done.stderr
    assert "mpiexec -n 4 -ppn 2 -hosts" in done.stderr and "--lr 0.1" in done.stderr


def test_a_singleton_with_no_other_world_size_still_runs() -> None:
    done = _run({"WORLD_SIZE": "1"})
    assert done.returncode == 0, done.stderr
    assert "trained alone" in done.stdout


def test_the_mpiexec_line_keeps_the_script_and_its_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    from collectives.torch_integration.launch import launcher_mismatch, mpiexec_command

    assert mpiexec_command(8).startswith("mpiexec -n 8 ")
    assert "-ppn" not in mpiexec_command(8, 8) and "-ppn 4 " in mpiexec_command(8, 4)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert launcher_mismatch(3) is None  # mpiexec and torch agree
    assert launcher_mismatch(2) is None  # an MPI job of several: not a torch launcher's doing
    assert "the launcher started 3" in (launcher_mismatch(1) or "")
