"""Settings that change what the ranks do are compared as a communicator is made, under mpiexec."""

import re
import subprocess

import pytest

from collectives import engine
from tests.exits.settings import TIMEOUT_S
from tests.mpirun import mpiexec, run_mpi

BOUND_S = 40  # the whole job; a case takes 1-3 s, a hang in MPI's node split for ever

_RECORD = r"(RAISED|SUMS) (\d) (.*?)(?=RAISED |SUMS |DONE |$)"
_DIFFER = "the ranks' settings differ"

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")


def _run(ranks: int, *settings: str) -> tuple[str, dict[int, str]]:
    """Each rank's ``RAISED ...`` or ``SUMS ...`` line (without the rank), after the job ended."""
    try:
        finished = run_mpi(ranks, ["-m", "tests.exits.settings", *settings], timeout=BOUND_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{settings}: the job hung; output:\n{expired.output}")
    output = finished.stdout
    assert finished.returncode == 0, f"exit status {finished.returncode}\n{output}"
    assert all(f"DONE {rank}" in output for rank in range(ranks)), output
    # the launcher may run two ranks' lines together: a record ends where another begins
    found = re.findall(_RECORD, output, re.MULTILINE | re.DOTALL)
    return output, {int(rank): f"{kind} {rest.strip()}" for kind, rank, rest in found}


def _raised(record: str, kind: str) -> str:
    """The message of a ``RAISED <kind> <seconds>: <message>`` record, raised well before the timeout."""
    match = re.fullmatch(rf"RAISED {kind} ([\d.]+): (.*)", record, re.DOTALL)
    assert match is not None, record
    assert float(match[1]) < TIMEOUT_S, record  # at creation, not a peer's timeout
    return match[2]


@needs_mpiexec
@pytest.mark.parametrize(
    ("ranks", "settings", "named"),
    [
        # MPI's node split waited for ever: one rank split into pretend nodes, the other by hosts
        (2, ["0:COLLECTIVES_RANKS_PER_NODE=1"], "COLLECTIVES_RANKS_PER_NODE: 1 on rank 0; unset on rank 1"),
        # the tuner's trial algorithm met the other rank's choice: a wrong sum, or a timeout naming nothing
        (2, ["1:COLLECTIVES_TUNE=1"], "COLLECTIVES_TUNE or tune=: 0 on rank 0; 1 on rank 1"),
        # a timeout naming no setting: one rank sent its signature, the other never looked for it
        (2, ["0:COLLECTIVES_CHECK=0"], "COLLECTIVES_CHECK or check=: 0 on rank 0; 1 on rank 1"),
        # the argument is compared as it acts, whatever the environment says
        (
            3,
            ["*:COLLECTIVES_CHECK=0", "2:check=1"],
            "COLLECTIVES_CHECK or check=: 0 on ranks 0, 1; 1 on rank 2",
        ),
        (3, ["1:COLLECTIVES_CUDA_IPC=0"], "COLLECTIVES_CUDA_IPC: unset on ranks 0, 2; 0 on rank 1"),
        (3, ["2:COLLECTIVES_CUDA_AWARE=yes"], "COLLECTIVES_CUDA_AWARE: unset on ranks 0, 1; 1 on rank 2"),
        # one rank reducing in the compiled engine, the other in numpy: of two NaNs each may keep another
        pytest.param(
            2,
            ["1:COLLECTIVES_COMPILED=0"],
            "the compiled engine (COLLECTIVES_COMPILED): 1 on rank 0; 0 on rank 1",
            marks=pytest.mark.skipif(not engine.compiled(), reason="the compiled engine is not built here"),
        ),
    ],
)
def test_a_setting_on_some_ranks_only_raises_on_every_rank_as_the_communicator_is_made(
    ranks: int, settings: list[str], named: str
) -> None:
    output, records = _run(ranks, *settings)
    assert sorted(records) == list(range(ranks)), output
    for rank in range(ranks):
        message = _raised(records[rank], "MismatchError")
        assert _DIFFER in message and named in message, output
        assert message == _raised(records[0], "MismatchError"), output  # the same words on every rank


@needs_mpiexec
def test_several_settings_that_differ_are_all_named() -> None:
    output, records = _run(2, "0:COLLECTIVES_TUNE=1", "1:COLLECTIVES_RANKS_PER_NODE=2")
    for rank in (0, 1):
        message = _raised(records[rank], "MismatchError")
        assert "COLLECTIVES_TUNE or tune=: 1 on rank 0; 0 on rank 1" in message, output
        assert "COLLECTIVES_RANKS_PER_NODE: unset on rank 0; 2 on rank 1" in message, output


@needs_mpiexec
def test_an_unusable_setting_on_one_rank_is_named_there_and_makes_the_others_raise_too() -> None:
    # was a raw ValueError ("invalid literal for int()") on rank 0 at its first call; rank 1 hung
    output, records = _run(2, "0:COLLECTIVES_RANKS_PER_NODE=²")
    message = _raised(records[0], "ConfigurationError")
    assert message == "COLLECTIVES_RANKS_PER_NODE='²' is not a whole number of ranks from 1 to 2147483647"
    message = _raised(records[1], "MismatchError")
    named = "COLLECTIVES_RANKS_PER_NODE: unusable (see its error) on rank 0; unset on rank 1"
    assert named in message, output


@needs_mpiexec
def test_an_unusable_engine_setting_on_one_rank_is_named_there_and_makes_the_others_raise_too() -> None:
    output, records = _run(2, "1:COLLECTIVES_COMPILED=fast")
    message = _raised(records[1], "ConfigurationError")
    assert message == "COLLECTIVES_COMPILED='fast' is neither 1 nor 0 (nor true/false, yes/no, on/off)"
    message = _raised(records[0], "MismatchError")
    assert "the compiled engine (COLLECTIVES_COMPILED): " in message, output
    assert "unusable (see its error) on rank 1" in message, output


@needs_mpiexec
def test_an_unusable_setting_on_every_rank_is_named_on_every_rank() -> None:
    huge = "1" + "0" * 23
    output, records = _run(2, f"*:COLLECTIVES_RANKS_PER_NODE={huge}")
    for rank in (0, 1):
        message = _raised(records[rank], "ConfigurationError")
        assert f"COLLECTIVES_RANKS_PER_NODE='{huge}' is not a whole number of ranks from 1 to" in message, (
            output
        )


@needs_mpiexec
def test_settings_alike_on_every_rank_run_as_before() -> None:
    settings = ["*:COLLECTIVES_TUNE=1", "*:COLLECTIVES_RANKS_PER_NODE=1", "*:COLLECTIVES_CHECK=0"]
    output, records = _run(2, *settings, "*:check=0")
    assert records == {0: "SUMS 0", 1: "SUMS 0"}, output
