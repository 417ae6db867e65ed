"""A real SIGINT into a loop of repeated calls, under mpiexec: no rank ever gets a wrong result."""

import subprocess

import pytest

from tests.mpirun import mpiexec, records, run_mpi

ROUNDS = 20
CALLS = 10_000
BOUND_S = 240  # the whole job; about 4 s on 2 quiet cores


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize("collective", ["allreduce", "allgather"])
def test_a_sigint_into_a_loop_of_repeated_calls_never_gives_a_wrong_result(collective: str) -> None:
    try:
        finished = run_mpi(2, ["-m", "tests.exits.sigint_loop", collective, str(ROUNDS), str(CALLS)], BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung; output:\n{expired.output}")
    output = finished.stdout
    assert finished.returncode == 0, output
    rounds = records(output, "ROUND ")
    assert len(rounds) == 2 * ROUNDS, output
    assert all(r["wrong"] == 0 for r in rounds), [r for r in rounds if r["wrong"]]
    # an interrupted call either left no trace (run again, the round went on) or broke the
    # communicator on both ranks, every error naming the interrupt
    assert all("KeyboardInterrupt" in r["ended"] for r in rounds if r["ended"]), output
    for number in range(ROUNDS):
        both = [r for r in rounds if r["round"] == number]
        if any(r["ended"] for r in both):
            assert all(r["ended"] for r in both) or max(r["done"] for r in both) == CALLS, both
    interrupted = sum(r["interrupts"] for r in rounds)
    assert interrupted >= ROUNDS // 4, f"the SIGINTs missed the calls: {interrupted} of {ROUNDS} landed"
