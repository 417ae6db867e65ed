"""Runs the MPI tests that matter for node structure as jobs of several nodes, emulated by MPICH's launcher.

``mpiexec -launcher fork -hosts localhost:G,127.0.0.1:G`` gives one machine two
host names, so MPI places G ranks on each as on two nodes: ``Split_type(SHARED)``
returns G ranks, and messages between them leave shared memory for the network
module. Each job is time-bounded.
"""

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from collectives.calibration import load_model
from tests.mpirun import BENCH, mpiexec, run_bounded

TIMEOUT_S = 150  # the whole job
TEST_TIMEOUT_S = 60  # one test

# the node split, the hierarchy, explain against dispatch, the tuner, pretend nodes, and the store
# with servers on every node; the torch backend at 2 x 2 only (importing torch costs seconds a rank),
# where torch is installed
SELECTED = [
    "tests/mpi/test_two_nodes.py",
    "tests/mpi/test_nodes.py",
    "tests/mpi/test_kvstore.py::test_sync_rounds_are_exact_and_bitwise_equal_everywhere",
]
TORCH = ["tests/mpi/test_torch_distributed.py::test_rooted_collectives"]
HOSTS = ["localhost", "127.0.0.1", "::1"]  # one machine under as many names as nodes


def hosts(nodes: int, per_node: int) -> str:
    """The ``-hosts`` list of ``nodes`` names for this machine, ``per_node`` ranks each."""
    return ",".join(f"{name}:{per_node}" for name in HOSTS[:nodes])


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
@pytest.mark.parametrize(("nodes", "per_node"), [(2, 2), (3, 2)])
def test_node_structure_under_emulated_nodes(nodes: int, per_node: int) -> None:
    launcher = mpiexec()
    assert launcher is not None
    ranks = nodes * per_node
    # torch's test by its node id only where torch imports: a skipped module has no such node to collect
    with_torch = ranks == 4 and importlib.util.find_spec("torch") is not None
    selected = SELECTED + (TORCH if with_torch else [])
    pytest_args = [
        "-m", "pytest", *selected, "--with-mpi", "-q", "-rs", "-p", "no:cacheprovider", "-x",
        f"--timeout={TEST_TIMEOUT_S}", "--timeout-method=thread",
    ]  # fmt: skip
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if ranks > (os.cpu_count() or 1):
        env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")  # oversubscribed: yield the core while waiting
    command = [launcher, "-launcher", "fork", "-hosts", hosts(nodes, per_node), "-n", str(ranks)]
    try:
        finished = run_bounded([*command, sys.executable, *pytest_args], env, TIMEOUT_S)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"{nodes} x {per_node} hung: no end after {TIMEOUT_S} s; output so far:\n{expired.output}"
        )
    output = finished.stdout
    assert finished.returncode == 0, f"{nodes} x {per_node} failed (exit {finished.returncode}):\n{output}"
    passed = [int(n) for n in re.findall(r"(\d+) passed", output)]
    assert len(passed) == ranks and min(passed) > 0, f"no tests ran at {nodes} x {per_node}:\n{output}"
    # the tests of several nodes ran on several nodes: none skipped for finding one
    assert not re.search(r"SKIPPED.*test_two_nodes", output), output


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_calibrate_on_two_nodes_saves_both_link_classes_under_the_jobs_shape(tmp_path: Path) -> None:
    launcher = mpiexec()
    assert launcher is not None
    path = tmp_path / "calibration.json"
    env = dict(os.environ, PYTHONUNBUFFERED="1", COLLECTIVES_CALIBRATION=str(path))
    command = [launcher, "-launcher", "fork", "-hosts", hosts(2, 2), "-n", "4", sys.executable]
    bench = [*BENCH, "calibrate", "--quick", "-n", "2", "-w", "0"]
    finished = run_bounded([*command, *bench], env, TIMEOUT_S)
    assert finished.returncode == 0, finished.stdout
    assert "2 nodes x 2 ranks" in finished.stdout and "# network: alpha" in finished.stdout
    saved = json.loads(path.read_text())["calibrations"]
    assert list(saved) == ["2x2"]
    entry = saved["2x2"]
    assert entry["nodes"] == 2 and entry["world_size"] == 4
    assert len(entry["exchanges"]) == len(entry["network_exchanges"]) == 4  # both classes timed
    model = load_model(path, world_size=4, nodes=2)
    assert model.network_beta is not None and model.network_alpha == entry["network_alpha"] >= 0
    assert "2 nodes of 2 ranks" in model.source
