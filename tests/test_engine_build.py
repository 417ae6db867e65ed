"""Without a C compiler the package still builds (a pure-Python wheel) and runs its Python path."""

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.wheels import built_wheel, installed


@pytest.mark.slow_build  # builds a wheel with pip and installs it: seconds here, tens without hatchling
@pytest.mark.timeout(240)
def test_a_machine_without_a_compiler_gets_a_working_pure_python_wheel(tmp_path: Path) -> None:
    no_tools = tmp_path / "bin"  # a PATH with no compiler on it
    no_tools.mkdir()
    environment = {**os.environ, "PATH": str(no_tools), "CC": "no-such-compiler"}
    wheel = built_wheel(tmp_path / "wheels", environment)
    assert wheel.name.endswith("-py3-none-any.whl"), wheel.name
    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.endswith(".so")]

    target = installed(wheel, tmp_path / "site")
    # without the run's own COLLECTIVES_COMPILED: this asks why a wheel without the engine runs none
    run_env = {key: value for key, value in os.environ.items() if key != "COLLECTIVES_COMPILED"}
    code = "from collectives import engine; print(engine.compiled()); print(engine.why())"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**run_env, "PYTHONPATH": str(target)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    compiled, why = result.stdout.splitlines()
    assert compiled == "False"
    assert why.startswith("the Python path: the compiled engine was not built"), why
