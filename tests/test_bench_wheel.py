"""The benchmark suite ships in the wheel: ``python -m collectives bench`` runs from an install elsewhere."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.mpirun import mpiexec, run_bounded
from tests.wheels import built_wheel, installed


@pytest.mark.slow_build  # builds a wheel with pip and installs it: seconds here, tens without hatchling
@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.timeout(300)
def test_the_installed_wheel_runs_the_benchmarks_from_outside_the_clone(tmp_path: Path) -> None:
    wheel = built_wheel(tmp_path / "wheels")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {"collectives/bench/__main__.py", "collectives/bench/collective.py"} <= names
    # the repository's forwarding package stays home
    assert not any(name.startswith("bench/") for name in names)

    target = installed(wheel, tmp_path / "site")
    away = tmp_path / "elsewhere"  # neither the clone nor the install: only the install is importable
    away.mkdir()
    environment = {**os.environ, "PYTHONPATH": str(target), "PYTHONUNBUFFERED": "1"}
    environment["COLLECTIVES_CALIBRATION"] = str(tmp_path / "calibration.json")  # not the user's cache
    launcher = mpiexec()
    assert launcher is not None

    def bench(*args: str, timeout: float) -> str:
        command = [launcher, "-n", "2", sys.executable, "-m", "collectives", "bench", *args]
        try:
            result = run_bounded(command, environment, timeout, cwd=away)
        except subprocess.TimeoutExpired as expired:
            pytest.fail(f"bench {args[0]} ran past {timeout} s:\n{expired.output}")
        assert result.returncode == 0, result.stdout
        return result.stdout

    table = bench("allreduce", "-b", "8", "-e", "4K", "-f", "8", "-n", "2", "-w", "1", timeout=120)
    assert table.startswith("# collectives allreduce benchmark")
    assert "# Out of bounds values : 0 OK" in table
    calibrated = bench("calibrate", "--quick", "-n", "2", "-w", "0", timeout=180)
    assert f"saved to {tmp_path / 'calibration.json'}" in calibrated
    assert (tmp_path / "calibration.json").stat().st_size > 0
