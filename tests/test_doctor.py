"""python -m collectives info and check: the facts a bug report needs, and a self-test finding a wrong sum."""

import json
import subprocess
import sys

import pytest

from tests.mpirun import ROOT, mpiexec, run_mpi

needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")


def test_info_alone_names_the_mpi_library_and_what_it_grants() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "collectives", "info", "--json"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)
    assert facts["mpi"]["world_size"] == 1 and facts["mpi"]["launcher"] == "none (a singleton)"
    assert facts["mpi"]["thread_level"] in ("single", "funneled", "serialized", "multiple")
    assert facts["mpi"]["library"] and facts["numpy"]
    assert "alpha_us" in facts["calibration"] or "error" in facts["calibration"]


@needs_mpiexec
def test_info_under_mpiexec_sees_every_rank_and_prints_once() -> None:
    done = run_mpi(2, ["-m", "collectives", "info"], timeout=60)
    assert done.returncode == 0, done.stdout
    assert done.stdout.count("MPI library") == 1
    assert "2 on 1 node(s)" in done.stdout and "mpiexec" in done.stdout


def test_an_unknown_command_is_refused_with_the_usage() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "collectives", "doctor"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2 and "unknown command 'doctor'" in done.stderr and "check" in done.stderr


@needs_mpiexec
@pytest.mark.parametrize("ranks", [1, 3])
def test_check_passes_every_algorithm_on_this_job(ranks: int) -> None:
    done = run_mpi(ranks, ["-m", "collectives", "check"], timeout=120)
    assert done.returncode == 0, done.stdout
    assert "all OK" in done.stdout
    assert any(line.split()[:2] == ["alltoall", "direct"] for line in done.stdout.splitlines())


# ring's allreduce with its last step dropped: a chunk never reaches every rank
_WRONG = """
import sys, types
from collectives.algorithms import ALGORITHMS, ring
from collectives.schedule import Schedule
from collectives.selfcheck import main

def allreduce(world_size, count):
    good = ring.allreduce(world_size, count)
    return Schedule(name="allreduce-wrong", collective=good.collective, world_size=good.world_size,
                    chunk_sizes=good.chunk_sizes, steps=good.steps[:-1], chunk_owner=good.chunk_owner)

ALGORITHMS["wrong"] = types.SimpleNamespace(allreduce=allreduce, cost=ring.cost, __name__="wrong")
sys.exit(main(["-c", "allreduce"]))
"""


@needs_mpiexec
def test_check_finds_a_wrong_algorithm_and_fails() -> None:
    done = run_mpi(3, ["-c", _WRONG], timeout=120)
    assert done.returncode == 1, done.stdout
    rows = {tuple(line.split()[:2]): line.split() for line in done.stdout.splitlines()}
    wrong = rows[("allreduce", "wrong")]
    assert wrong[-1] == "WRONG" and int(wrong[3]) > 0, wrong
    assert "1 FAILED" in done.stdout
    assert rows[("allreduce", "ring")][-1] == "ok"  # the others still ran, and passed
