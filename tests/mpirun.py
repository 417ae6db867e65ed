"""Launching time-bounded mpiexec runs from the test suite."""

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = ["-m", "collectives", "bench"]  # the benchmark suite, as an installed package runs it


def mpiexec() -> str | None:
    """The mpiexec to use: $COLLECTIVES_MPIEXEC, the one beside this Python (the mpich wheel's), or PATH's."""
    chosen = os.environ.get("COLLECTIVES_MPIEXEC")
    if chosen:
        return chosen
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    return shutil.which("mpiexec")


def run_mpi(ranks: int, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``mpiexec -n ranks python ARGS`` from the repository root; kill the whole job after ``timeout`` s.

    Raises:
        subprocess.TimeoutExpired: the job ran too long (a deadlock); its output so far is attached.
    """
    launcher = mpiexec()
    if launcher is None:
        raise FileNotFoundError("no mpiexec found; install the mpich extra or set COLLECTIVES_MPIEXEC")
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return run_bounded([launcher, "-n", str(ranks), sys.executable, *args], env, timeout)


def run_bounded(
    command: list[str], env: dict[str, str], timeout: float, cwd: Path = ROOT
) -> subprocess.CompletedProcess[str]:
    """Run ``command`` from ``cwd`` (the repository root) in a session of its own; kill it after ``timeout``.

    Whatever the session still runs when the launcher returns (ranks a launcher gave up on) is
    killed too.

    Raises:
        subprocess.TimeoutExpired: the job ran too long (a deadlock); its output so far is attached.
    """
    with subprocess.Popen(
        command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    ) as process:  # fmt: skip
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
            expired.output = output
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
    return subprocess.CompletedProcess(command, process.returncode, output, None)


def records(output: str, tag: str) -> list[Any]:
    """Every ``TAG {json}`` record the ranks printed, also where the launcher ran two lines together."""
    decoder, found = json.JSONDecoder(), []
    at = output.find(tag)
    while at >= 0:
        record, end = decoder.raw_decode(output, at + len(tag))
        found.append(record)
        at = output.find(tag, end)
    return found
