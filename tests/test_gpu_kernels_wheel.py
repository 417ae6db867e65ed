"""The CUDA kernel sources ship in the wheel, and the installed loader finds them there."""

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from collectives.backends import gpu_kernels
from tests.wheels import built_wheel, installed


@pytest.mark.slow_build  # builds a wheel with pip and installs it: seconds here, tens without hatchling
@pytest.mark.timeout(180)
def test_the_installed_wheel_holds_and_finds_the_kernel_sources(tmp_path: Path) -> None:
    wheel = built_wheel(tmp_path / "wheels")

    sources = gpu_kernels.kernel_sources()
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {f"collectives/kernels/{name}" for name in sources} <= names

    target = installed(wheel, tmp_path / "site")
    code = (
        "import json, collectives\n"
        "from collectives.backends import gpu_kernels as g\n"
        "print(json.dumps([collectives.__file__, str(g._kernel_dir()), g.kernel_sources()]))\n"
    )
    # run away from the source tree, with only the install on the path
    environment = {**os.environ, "PYTHONPATH": str(target)}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    package_file, kernel_dir, installed_sources = json.loads(result.stdout)
    assert Path(package_file).is_relative_to(target)
    assert Path(kernel_dir) == target / "collectives" / "kernels"
    assert installed_sources == sources
