"""An allreduce past MPI's int count limit: 2**31 + 7 int8 elements on 2 ranks (issue 8)."""

import os
import subprocess

import pytest

from .mpirun import mpiexec, run_mpi

# two ranks each hold the input, the result and the root's scratch: about 13 GiB in all
NEEDED_BYTES = 16 * 2**30


def _memory() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.skipif(_memory() < NEEDED_BYTES, reason="needs 16 GiB of memory for 2 GiB buffers on 2 ranks")
def test_an_int8_allreduce_of_more_than_2_31_elements_is_right() -> None:
    # direct sends the whole buffer as one message of 2**31 + 7 bytes: MPI's large-count calls
    try:
        result = run_mpi(2, ["tests/large_count_allreduce.py", "direct"], timeout=300)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the large-count allreduce hung:\n{expired.output}")
    assert result.returncode == 0, result.stdout
    assert "direct: 2147483655 int8 elements reduced correctly" in result.stdout
