"""Setups under the deadline (issue 30, item 5): a rank that never takes part makes the others raise."""

import re
import subprocess

import pytest

from tests.exits.setup_paths import TIMEOUT_S
from tests.mpirun import mpiexec, run_mpi

BOUND_S = 60  # the whole job; each case takes about 6 s

_RAISED = r"RAISED (\d) (\w+) ([\d.]+): (.*?)(?=RAISED |DONE |MADE |$)"

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")


def _run(case: str, ranks: int) -> tuple[str, dict[int, tuple[str, float, str]]]:
    try:
        finished = run_mpi(ranks, ["-m", "tests.exits.setup_paths", case], timeout=BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{case}: the setup hung; output:\n{expired.output}")
    output = finished.stdout
    assert finished.returncode == 0, f"{case}: exit status {finished.returncode}\n{output}"
    assert all(f"DONE {rank}" in output for rank in range(ranks)), output
    # the launcher may run two ranks' lines together: a message ends where another record begins
    raised = {
        int(rank): (kind, float(seconds), message)
        for rank, kind, seconds, message in re.findall(_RAISED, output, re.MULTILINE)
    }
    return output, raised


@needs_mpiexec
@pytest.mark.parametrize("case", ["alloc_first", "alloc_second"])
def test_alloc_without_a_peer_times_out(case: str) -> None:
    output, raised = _run(case, 2)
    kind, seconds, message = raised[0]
    assert kind == "CollectiveTimeout" and "alloc" in message and "rank 1" in message, output
    assert seconds <= TIMEOUT_S + 1, output


@needs_mpiexec
@pytest.mark.parametrize("case", ["sibling", "store"])
def test_a_duplicate_without_a_peer_times_out(case: str) -> None:
    # MPI's Comm_dup cannot be bounded: the ranks meet by messages first
    output, raised = _run(case, 2)
    kind, seconds, message = raised[0]
    assert kind == "CollectiveTimeout" and "duplicate" in message and "rank 1" in message, output
    assert seconds <= TIMEOUT_S + 1, output


@needs_mpiexec
def test_new_group_with_other_members_on_other_ranks_raises_on_every_member() -> None:
    pytest.importorskip("torch", reason="the torch integration needs torch")
    output, raised = _run("new_group", 3)
    assert sorted(raised) == [0, 1, 2], output
    for rank in (0, 1):  # they heard each other's lists
        kind, _, message = raised[rank]
        assert kind == "MismatchError" and "[0, 1]" in message and "[0, 1, 2]" in message, output
    kind, seconds, message = raised[2]  # rank 0 never sends it a list: its timeout names rank 0
    assert kind == "CollectiveTimeout" and "[0]" in message and seconds <= TIMEOUT_S + 1, output
