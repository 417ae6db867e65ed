"""Non-blocking collectives never waited for, under mpiexec: they complete at exit, and the job ends."""

import subprocess
import textwrap

import pytest

from tests.mpirun import mpiexec, run_mpi

TIMEOUT_S = 120

_SCRIPT = textwrap.dedent(
    """
    import atexit
    import numpy as np
    import collectives
    from collectives.requests import busy

    comm = collectives.Communicator(timeout=60)
    # registered before the first started call, so it runs after the library's own handler
    atexit.register(lambda: print(f"rank {comm.rank} exits with {len(busy)} lanes busy", flush=True))
    x = np.ones(1 << 18)
    for _ in range(4):
        collectives.iallreduce(x, comm=comm)  # started, never waited for
    collectives.ibarrier(comm)
    print(f"rank {comm.rank} leaves", flush=True)
    """
)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_requests_never_waited_for_end_with_the_job() -> None:
    try:
        finished = run_mpi(2, ["-c", _SCRIPT], timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung at exit: no end after {TIMEOUT_S} s; output:\n{expired.output}")
    assert finished.returncode == 0, finished.stdout
    assert finished.stdout.count("leaves") == 2, finished.stdout
    # the started calls completed before MPI was finalized, not cut off
    assert finished.stdout.count("exits with 0 lanes busy") == 2, finished.stdout
