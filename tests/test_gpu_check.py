"""bench/gpu_check.sh, the one command a GPU session runs, still runs: its steps name tests that exist.

Without a GPU its test steps skip every test and pass, and its env step fails (no CuPy device).
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.mpirun import ROOT

SCRIPT = ROOT / "bench" / "gpu_check.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("bash") is None or shutil.which("timeout") is None,
    reason="needs bash and coreutils' timeout",
)


def run(out: Path, *steps: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(SCRIPT), str(out), *steps],
        env=dict(os.environ, PYTHON=sys.executable),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )


def test_the_test_steps_find_their_tests(tmp_path: Path) -> None:
    finished = run(tmp_path, "kernels", "staging", "ipc")
    summary = (tmp_path / "summary.txt").read_text().splitlines()
    assert [line.split()[0] for line in summary] == ["kernels", "staging", "ipc"], finished.stdout
    for line in summary:
        assert " exit   0 " in line and "skipped" in line and "error" not in line, line
    assert finished.returncode == 0
    log = (tmp_path / "kernels.log").read_text()
    assert "test_gpu_kernels_device.py" in log and "no tests ran" not in log


def test_an_unknown_step_is_refused(tmp_path: Path) -> None:
    finished = run(tmp_path, "kernels", "nonsense")
    assert finished.returncode == 2
    assert "unknown step 'nonsense'" in finished.stderr
    assert not (tmp_path / "summary.txt").exists()
