"""The project built into a wheel with pip and installed into a folder of its own, as the wheel tests do."""

import importlib.util
import subprocess
import sys
from pathlib import Path

from tests.mpirun import ROOT


def built_wheel(folder: Path, env: dict[str, str] | None = None) -> Path:
    """The wheel pip builds of the checkout into ``folder`` (under ``env``, if given)."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(folder), str(ROOT)]
    if importlib.util.find_spec("hatchling") is not None:
        command.insert(-1, "--no-build-isolation")  # else pip fetches hatchling from PyPI first: slower
    built = subprocess.run(command, env=env, capture_output=True, text=True, timeout=200, check=False)
    assert built.returncode == 0, built.stderr
    (wheel,) = folder.glob("collectives_mpi-*.whl")
    return wheel


def installed(wheel: Path, target: Path) -> Path:
    """``wheel`` installed (without its dependencies) into ``target``, a folder to put on the path."""
    install = [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--quiet",
        "--target",
        str(target),
        str(wheel),
    ]
    subprocess.run(install, check=True, timeout=120)
    return target
