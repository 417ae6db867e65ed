"""Horovod Elastic on MPI: a lost rank survived from the last commit (ULFM), or a named end without it."""

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.mpirun import mpiexec, records, run_mpi
from tests.ulfm.launch import INSTALL, openmpi_prefix, run_ulfm

torch = pytest.importorskip("torch")

from collectives.errors import PeerFailedError  # noqa: E402
from collectives.torch_integration.horovod.elastic import (  # noqa: E402
    REPLACE_ENV,
    HostsUpdatedInterrupt,
    ObjectState,
    run_fn,
)
from tests.horovod_scripts.elastic_synthetic import LR, data_of, make_model  # noqa: E402

SCRIPT = "tests.horovod_scripts.elastic_synthetic"
MNIST = "tests.horovod_scripts.elastic_mnist"
needs_openmpi = pytest.mark.skipif(openmpi_prefix() is None, reason=f"no Open MPI for ULFM ({INSTALL})")
needs_mpiexec = pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
HOROVOD = Path(os.environ.get("HOROVOD_MIRROR", "/work/.mirror/horovod+horovod/repo"))  # a bare git clone
EXAMPLES = "examples/elastic/pytorch"
needs_horovod = pytest.mark.skipif(
    not (HOROVOD / "HEAD").exists(),
    reason=f"no Horovod clone to take its examples from at {HOROVOD} (set $HOROVOD_MIRROR to a bare clone)",
)
STANDIN = Path(__file__).parent / "horovod_scripts" / "torchvision_standin"


def _killed(
    script: str, rounds: str, fault: str, tag: str, replace: bool = False
) -> tuple[list[dict[str, Any]], str]:
    """The survivors' records of ``script`` under ULFM at 3 ranks with ``fault``, and the job's output."""
    env = {"COLLECTIVES_FAULT": fault, **({REPLACE_ENV: "1"} if replace else {})}
    try:  # a replacement's start (MPI_Comm_spawn) takes tens of seconds on a loaded 2-core machine
        done = run_ulfm(3, ["-m", script, rounds], timeout=180 if replace else 120, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the elastic run hung:\n{str(expired.output)[-3000:]}")
    return records(done.stdout, tag), done.stdout[-3000:]


def _replay(
    sizes: list[int], everyone: list[int], survivors: list[int], skip: int | None = None
) -> list[Any]:
    """The parameters after the committed batches, each over the processes alive then, in one process."""
    model = make_model()
    for batch, size in enumerate(sizes):
        if batch == skip:
            continue
        ranks = everyone if size == len(everyone) else survivors
        grads = [torch.zeros_like(p) for p in model.parameters()]
        for rank in ranks:
            model.zero_grad()
            data, target = data_of(rank)
            torch.nn.functional.cross_entropy(model(data), target).backward()
            for total, p in zip(grads, model.parameters(), strict=True):
                total += p.grad
        with torch.no_grad():
            for p, total in zip(model.parameters(), grads, strict=True):
                p -= LR * size * total / len(ranks)
    return [p.detach().reshape(-1).tolist() for p in model.parameters()]


def _close(a: list[Any], b: list[Any], tolerance: float) -> bool:
    return all(
        abs(x - y) <= tolerance for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True)
    )


@needs_mpiexec
def test_an_elastic_run_without_failure_trains_as_the_plain_loop() -> None:
    done = run_mpi(2, ["-m", SCRIPT, "5"], timeout=90)
    assert done.returncode == 0, done.stdout
    ranks = records(done.stdout, "ELASTIC ")
    assert sorted(r["rank"] for r in ranks) == [0, 1]
    for record in ranks:
        assert record["sizes"] == [2] * 5 and record["resets"] == []
        assert _close(record["params"], _replay([2] * 5, [0, 1], [0, 1]), 1e-6)


@needs_openmpi
def test_a_rank_killed_mid_training_is_survived_from_the_last_commit() -> None:
    # rank 2 dies as its 16th collective call begins (batch 2's gradient allreduce); the two
    # survivors go back to their last commit, shrink, call the reset callbacks and go on at size 2
    survivors, output = _killed(SCRIPT, "8", "2:15:kill", "ELASTIC ")
    assert sorted(r["launch_rank"] for r in survivors) == [0, 1], output
    sizes = survivors[0]["sizes"]
    assert len(sizes) == 8 and 3 in sizes and sizes[-1] == 2 and sizes == sorted(sizes, reverse=True)
    replayed = _replay(sizes, [0, 1, 2], [0, 1])
    for record in survivors:
        assert record["sizes"] == sizes and record["size"] == 2 and record["resets"] == [2]
        # every committed batch applied once: the replay matches; without one batch it would not
        assert _close(record["params"], replayed, 1e-6), record
        assert not _close(record["params"], _replay(sizes, [0, 1, 2], [0, 1], skip=sizes.index(2)), 1e-4)


@needs_openmpi
def test_with_replace_a_new_process_takes_the_lost_ranks_place_and_the_world_grows_back() -> None:
    # rank 2 dies in batch 2; the survivors redo it at size 2, and at that batch's commit
    # check_host_updates raises HostsUpdatedInterrupt: a process spawned in rank 2's place
    # (with rank 2's data) joins at its first sync with rank 0's commit, and all go on at size 3
    ranks, output = _killed(SCRIPT, "8", "2:15:kill", "ELASTIC ", replace=True)
    assert sorted(r["rank"] for r in ranks) == [0, 1, 2], output
    sizes = ranks[0]["sizes"]
    assert len(sizes) == 8 and sizes[:2] == [3, 3] and 2 in sizes and sizes[-1] == 3, sizes
    replayed = _replay(sizes, [0, 1, 2], [0, 1])
    for record in ranks:
        assert record["sizes"] == sizes and record["size"] == 3, record
        # the survivors' callbacks saw the world shrink, then grow; the new process saw no reset
        assert record["resets"] == ([2, 3] if record["launch_rank"] < 2 else []), record
        assert _close(record["params"], replayed, 1e-6), record
        assert not _close(record["params"], _replay(sizes, [0, 1, 2], [0, 1], skip=sizes.index(2)), 1e-4)


@needs_openmpi
def test_the_mnist_example_loses_a_rank_mid_epoch_and_finishes_its_epochs() -> None:
    # rank 1 dies as its 13th collective call begins (a gradient allreduce of epoch 1); launch
    # rank 2 becomes rank 1, both finish epoch 2 and the test's named allreduces
    survivors, output = _killed(MNIST, "2", "1:12:kill", "MNIST ")
    assert sorted(r["launch_rank"] for r in survivors) == [0, 2], output
    assert sorted(r["rank"] for r in survivors) == [0, 1]
    for record in survivors:
        assert record["size"] == 2 and record["epoch"] == 2 and record["resets"] == [2]
    assert len({r["digest"] for r in survivors}) == 1 and len({r["loss"] for r in survivors}) == 1


@needs_mpiexec
def test_without_fault_tolerance_a_lost_rank_ends_the_run_in_bounded_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # MPICH has no ULFM: a rank's death ends the job (the launcher's doing), and nothing waits forever
    monkeypatch.setenv("COLLECTIVES_FAULT", "2:15:kill")
    try:
        done = run_mpi(3, ["-m", SCRIPT, "8"], timeout=90)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the run hung after a rank died:\n{str(expired.output)[-3000:]}")
    assert done.returncode != 0
    assert records(done.stdout, "ELASTIC ") == []  # no survivor went on as if nothing happened
    assert "KILLED" in done.stdout or "killed" in done.stdout or "TERMINATION" in done.stdout, done.stdout[
        -2000:
    ]


def _horovod_example(name: str, folder: Path) -> Path:
    """Horovod's example ``name`` written into ``folder`` with only its import changed to ours."""
    text = subprocess.run(
        ["git", f"--git-dir={HOROVOD}", "show", f"HEAD:{EXAMPLES}/{name}"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    lines = text.splitlines(keepends=True)
    imports = [i for i, line in enumerate(lines) if line.strip() == "import horovod.torch as hvd"]
    assert len(imports) == 1, f"{name}: expected one 'import horovod.torch as hvd'"
    lines[imports[0]] = "import collectives.horovod as hvd\n"
    path = folder / name
    path.write_text("".join(lines))
    return path


def _run_example(
    path: Path, args: list[str], fault: str, home: Path, replace: bool = False
) -> subprocess.CompletedProcess[str]:
    """``path`` under ULFM at 3 ranks with ``fault``, torchvision our stand-in, ``~`` in ``home``."""
    paths = [str(STANDIN), str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
    env = {"COLLECTIVES_FAULT": fault, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    env.update({"HOME": str(home), **({REPLACE_ENV: "1"} if replace else {})})
    try:
        return run_ulfm(3, [str(path), *args], timeout=180, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"{path.name} hung:\n{str(expired.output)[-3000:]}")


SYNTHETIC_ARGS = ["--batch-size", "2", "--num-warmup-batches", "2", "--num-batches-per-iter", "2"]
SYNTHETIC_ARGS += ["--num-iters", "3"]


@needs_openmpi
@needs_horovod
def test_horovods_synthetic_benchmark_example_gets_its_world_back_after_a_rank_killed(tmp_path: Path) -> None:
    # rank 2 is killed at its 16th collective call, a gradient allreduce of the warm-up; with
    # COLLECTIVES_ELASTIC_REPLACE=1 a new process takes its place (the shrinking alone is the
    # MNIST example's test below, and the scripts' above: each launch costs tens of seconds here)
    script = _horovod_example("pytorch_synthetic_benchmark_elastic.py", tmp_path)
    done = _run_example(script, SYNTHETIC_ARGS, "2:16:kill", tmp_path, replace=True)
    output = done.stdout.replace("\0", "")
    assert "kill at allreduce" in output and "Number of CPUs: 3" in output, output[-3000:]
    assert "Total img/sec on 3 CPU(s)" in output, output[-3000:]  # its last line, on the world grown back


@needs_openmpi
@needs_horovod
def test_horovods_mnist_example_survives_a_rank_killed_mid_epoch(tmp_path: Path) -> None:
    # 48 synthetic images, 2 batches of 8 per rank and epoch; rank 2 is killed at its 16th
    # collective call: a gradient allreduce of epoch 1's second batch
    script = _horovod_example("pytorch_mnist_elastic.py", tmp_path)
    args = ["--batch-size", "8", "--test-batch-size", "16", "--epochs", "2", "--data-dir", str(tmp_path)]
    done = _run_example(script, args, "2:16:kill", tmp_path)
    output = done.stdout.replace("\0", "")
    assert "kill at allreduce" in output, output[-3000:]
    assert "Train Epoch: 2" in output and "Test set: Average loss" in output, output[-3000:]


def test_grow_refuses_no_processes_and_a_communicator_not_over_mpi() -> None:
    from collectives import Communicator
    from collectives.errors import ConfigurationError
    from collectives.resilience import grow
    from collectives.transport.loopback import LoopbackWorld

    with pytest.raises(ConfigurationError, match="count=0"):
        grow(["python"], 0)
    transport = LoopbackWorld(1).transport(0)
    with pytest.raises(ConfigurationError, match="grow needs an MPI communicator, got LoopbackTransport"):
        grow(["python"], 1, comm=Communicator(transport))


def test_with_replace_the_commit_after_a_loss_announces_hosts_and_the_reset_grows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the MPI calls stood in for: shrinking loses one rank, growing records what it was asked
    from collectives.torch_integration.horovod import elastic

    grown: list[tuple[list[str], int]] = []
    worlds: list[int] = []
    monkeypatch.setattr(elastic, "survive", lambda error, comm: 1)
    monkeypatch.setattr(elastic, "grow", lambda argv, count: grown.append((argv, count)))
    monkeypatch.setenv(REPLACE_ENV, "1")
    state = _Counter()
    failures = iter([True, False])
    commits: list[int] = []

    def train(state: _Counter) -> int:
        while state.done < 4:
            state.done += 1
            if state.done == 2 and next(failures):
                raise PeerFailedError("rank 2 died", collective="allreduce", sequence=3, peers=(2,), rank=0)
            commits.append(state.done)
            state.commit()
        return state.done

    hvd = elastic.Elastic(lambda: worlds.append(len(grown)), lambda: None)
    assert hvd.run(train)(state) == 4
    # the first commit after the loss (batch 2 redone) raised; the reset grew by one process
    # running this command line; later commits announced nothing more
    assert grown == [([sys.executable, *sys.orig_argv[1:]], 1)] and worlds == [0, 1]
    assert commits == [1, 2, 3, 4] and state.synced == 3


class _Counter(ObjectState):
    def __init__(self) -> None:
        self.synced = 0
        super().__init__(bcast_object=lambda state: state, get_rank=lambda: 0, steps=[], done=0)

    def sync(self) -> None:
        self.synced += 1
        super().sync()


def test_a_failure_restores_the_last_commit_resets_and_runs_again() -> None:
    state = _Counter()
    failures = iter([True, False])
    resets: list[str] = []
    called: list[int] = []
    state.register_reset_callbacks([lambda: called.append(len(state.steps))])

    def train(state: _Counter) -> int:
        while state.done < 4:
            state.steps.append(state.done)
            state.done += 1
            if state.done == 3 and next(failures):
                raise PeerFailedError("rank 1 died", collective="allreduce", sequence=3, peers=(1,), rank=0)
            if state.done % 2 == 0:
                state.commit()
        return state.done

    result = run_fn(train, lambda error: resets.append(type(error).__name__))(state)
    assert result == 4 and state.steps == [0, 1, 2, 3]  # batch 2's uncommitted append undone once
    assert resets == ["PeerFailedError"] and called == [2] and state.synced == 2


def test_hosts_updated_reruns_without_restoring_and_may_skip_the_sync() -> None:
    state = _Counter()
    interrupts = iter([HostsUpdatedInterrupt(skip_sync=True), None])

    def train(state: _Counter) -> int:
        state.done += 1
        interrupt = next(interrupts)
        if interrupt is not None:
            raise interrupt
        return state.done

    resets: list[str] = []
    assert run_fn(train, lambda error: resets.append(type(error).__name__))(state) == 2
    assert state.synced == 1  # the first run's; the second was skipped
    assert resets == ["HostsUpdatedInterrupt"]  # the world made anew with the announced hosts


def test_an_error_of_the_program_itself_is_not_taken_for_a_lost_rank() -> None:
    state = _Counter()

    def train(state: _Counter) -> None:
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        run_fn(train, lambda error: pytest.fail("no reset"))(state)
