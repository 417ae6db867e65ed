"""Fault injection and in-memory checkpoints on the loopback transport (ranks as threads)."""

import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from collectives import BrokenCommunicatorError, CollectivesError, Communicator, ConfigurationError, allreduce
from collectives.faults import PLAN, Fault, InjectedFault, arm, disarm, parse
from collectives.resilience import Checkpointer, CheckpointError, holders_of
from collectives.resilience.serial import dumps, loads

from .conftest import run_ranks


@pytest.fixture(autouse=True)
def _no_faults_left() -> Iterator[None]:
    disarm()
    yield
    disarm()


def test_the_fault_syntax_reads_every_form() -> None:
    assert parse("1:5") == (Fault(1, 5, "kill"),)
    assert parse(" 0:3:exit , 2:checkpoint:1:hang") == (
        Fault(0, 3, "exit"),
        Fault(2, 1, "hang", "checkpoint"),
    )
    assert str(Fault(2, 1, "hang", "checkpoint")) == "2:checkpoint:1:hang"
    assert parse("1:2:exit:3") == (Fault(1, 2, "exit", step=3),)
    assert str(Fault(1, 2, "exit", step=3)) == "1:2:exit:3"


@pytest.mark.parametrize(
    "bad", ["1", "a:2", "1:2:explode", "1:checkpoint", "1:2:kill:x", "1:checkpoint:2:kill:3", "-1:2"]
)
def test_a_fault_that_does_not_parse_is_named(bad: str) -> None:
    with pytest.raises(ConfigurationError, match="COLLECTIVES_FAULT"):
        parse(bad)


def test_nothing_is_armed_unless_asked() -> None:
    assert not PLAN.armed
    arm("1:2:raise")
    assert PLAN.armed
    disarm()
    assert not PLAN.armed


def test_an_injected_fault_fails_the_chosen_rank_at_the_chosen_call_and_the_others_hear_of_it() -> None:
    arm("1:2:raise")
    calls: list[list[int]] = [[], [], []]

    def body(comm: Communicator) -> str:
        x = np.ones(4, np.float32)
        try:
            for i in range(5):
                allreduce(x, comm=comm)
                calls[comm.rank].append(i)
        except InjectedFault as error:
            return f"injected: {error}"
        except BrokenCommunicatorError as error:
            return f"broken by {error.rank}"
        return "done"

    outcomes = run_ranks(3, body, timeout=20.0)
    assert outcomes[1].startswith("injected: collectives: rank 1: injected fault 1:2:raise")
    assert "allreduce #2" in outcomes[1]
    assert outcomes[0] == outcomes[2] == "broken by 1"
    assert calls[1] == [0, 1]  # calls #0 and #1 ran, #2 failed
    assert PLAN.fired == [Fault(1, 2, "raise")]


def test_the_count_covers_the_repeat_call_path_and_other_collectives() -> None:
    # calls 0..3: allreduce (first: full path), allreduce (repeat path), broadcast, allreduce
    arm("0:3:raise")

    def body(comm: Communicator) -> int:
        x = np.ones(8, np.float64)
        done = 0
        try:
            allreduce(x, comm=comm)
            done += 1
            allreduce(x, comm=comm)
            done += 1
            from collectives import broadcast

            broadcast(x, comm=comm)
            done += 1
            allreduce(x, comm=comm)
            done += 1
        except (InjectedFault, BrokenCommunicatorError):
            pass
        return done

    assert run_ranks(2, body, timeout=20.0) == [3, 3]


@pytest.mark.parametrize("step", [0, 2])
def test_a_fault_at_a_step_fails_the_rank_mid_collective_after_its_messages_of_that_step(step: int) -> None:
    arm(f"2:1:raise:{step}")  # rank 2's second call, at its wait of the ring's step `step`
    waits: list[int] = []

    def body(comm: Communicator) -> str:
        x = np.ones(12, np.float32)
        try:
            allreduce(x, algorithm="ring", comm=comm)
            if comm.rank == 2:  # count this rank's waits from here on, as the fault does
                comm.watchdog.watched.waitall = _counting(comm.watchdog.watched.waitall, waits)  # type: ignore
            allreduce(x, algorithm="ring", comm=comm)
        except InjectedFault as error:
            return str(error)
        except BrokenCommunicatorError as error:
            return f"broken by {error.rank}"
        return "done"

    outcomes = run_ranks(3, body, timeout=20.0)
    assert outcomes[2].endswith(f"raise at allreduce #1, step {step}")
    # rank 0 waits on rank 2's later messages; rank 1 may finish, having all it needs by then
    assert outcomes[0] == "broken by 2" and outcomes[1] in ("broken by 2", "done")
    assert len(waits) == step + 1  # it failed in the wait of that step, not before


def _counting(waitall: Any, seen: list[int]) -> Any:
    def counted(requests: Any) -> None:
        seen.append(len(requests))
        waitall(requests)

    return counted


def test_a_fault_at_a_step_the_call_never_reaches_fails_the_rank_as_its_next_call_begins() -> None:
    arm("0:0:raise:99")

    def body(comm: Communicator) -> str:
        x = np.ones(4, np.float32)
        allreduce(x, algorithm="ring", comm=comm)  # 2 (P - 1) = 2 steps: the fault is late
        try:
            allreduce(x, algorithm="ring", comm=comm)
        except InjectedFault as error:
            return str(error)
        except BrokenCommunicatorError as error:
            return f"broken by {error.rank}"
        return "done"

    outcomes = run_ranks(2, body, timeout=20.0)
    assert "allreduce #0, which ended before step 99; as allreduce #1 began" in outcomes[0]
    assert outcomes[1] == "broken by 0"


def _state(rank: int, step: int) -> dict[str, Any]:
    return {"rank": rank, "step": step, "weights": np.arange(10, dtype=np.float64) * (rank + 1) + step}


@pytest.mark.parametrize(("size", "replicas"), [(1, 1), (2, 1), (3, 1), (4, 2)])
def test_every_rank_keeps_its_state_and_its_neighbours_copies(size: int, replicas: int) -> None:
    def body(comm: Communicator) -> tuple[int, Any, dict[int, Any], tuple[int, ...]]:
        ck = Checkpointer(comm, replicas=replicas)
        assert ck.load() is None and ck.version == 0
        for step in range(3):
            version = ck.checkpoint(_state(comm.rank, step))
        copies = {r: ck.replica_of(r) for r in ck.held}
        return version, ck.load(), copies, ck.held

    results = run_ranks(size, body)
    kept = min(replicas, size - 1)
    for rank, (version, mine, copies, held) in enumerate(results):
        assert version == 3
        assert mine["rank"] == rank and mine["step"] == 2
        np.testing.assert_array_equal(mine["weights"], _state(rank, 2)["weights"])
        assert set(held) == {rank, *((rank - j) % size for j in range(1, kept + 1))}
        for owner, copy in copies.items():
            assert copy["rank"] == owner and copy["step"] == 2
            np.testing.assert_array_equal(copy["weights"], _state(owner, 2)["weights"])
            assert rank == owner or rank in holders_of(owner, size, kept)


def test_a_lost_ranks_state_is_found_on_its_holder_and_a_missing_copy_is_named() -> None:
    def body(comm: Communicator) -> Any:
        ck = Checkpointer(comm)
        ck.checkpoint({"w": np.full(3, comm.rank)})
        if comm.rank == 2:
            with pytest.raises(CheckpointError, match="keeps no copy of rank 0's state"):
                ck.replica_of(0)
            moved = Checkpointer(comm, version=ck.version)  # a replacement adopting a lost rank's copy
            moved.adopt(1, ck.replica_bytes(1))
            return moved.replica_of(1)
        return None

    found = run_ranks(3, body)[2]
    np.testing.assert_array_equal(found["w"], np.full(3, 1))


def test_ranks_at_different_versions_are_refused_on_every_rank() -> None:
    def body(comm: Communicator) -> str:
        ck = Checkpointer(comm, version=comm.rank)  # rank 1 thinks it is one version ahead
        with pytest.raises(CheckpointError, match="rank 0 at 0, rank 1 at 1") as caught:
            ck.checkpoint(1)
        return str(caught.value)

    assert all("versions differ" in text for text in run_ranks(2, body))


def test_an_unpicklable_state_and_bad_settings_are_named_on_every_rank() -> None:
    def body(comm: Communicator) -> int:
        with pytest.raises(ConfigurationError, match="replicas"):
            Checkpointer(comm, replicas=-1)
        ck = Checkpointer(comm)
        with pytest.raises(CheckpointError, match="the state of rank 1 does not pickle"):
            ck.checkpoint((lambda: None) if comm.rank == 1 else {"fine": 1})
        return ck.checkpoint({"fine": comm.rank})  # nothing broke: the next one is version 1

    assert run_ranks(2, body) == [1, 1]


def test_the_checkpoint_is_a_snapshot_of_the_state_when_taken() -> None:
    def body(comm: Communicator) -> Any:
        ck = Checkpointer(comm)
        state = {"w": np.zeros(2)}
        ck.checkpoint(state)
        state["w"] += 5
        return ck.load(), loads(ck.replica_bytes(comm.rank))

    loaded, raw = run_ranks(2, body)[0]
    np.testing.assert_array_equal(loaded["w"], np.zeros(2))
    np.testing.assert_array_equal(raw["w"], np.zeros(2))


@pytest.mark.parametrize(
    "state",
    [
        None,
        {"a": np.arange(7, dtype=np.float64), "b": [np.ones((3, 5), np.int16), "text"], "c": 3},
        {"fortran": np.asfortranarray(np.arange(12.0).reshape(3, 4)), "empty": np.zeros(0, np.float32)},
    ],
)
def test_a_state_comes_back_from_its_bytes_with_arrays_aligned_and_writable(state: Any) -> None:
    data = dumps(state)
    for copy in (True, False):
        back = loads(data, copy=copy)
        if state is None:
            assert back is None
            continue
        for key, value in state.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(back[key], value)
                assert back[key].flags.writeable and back[key].flags.aligned
    with pytest.raises(ValueError, match="not a checkpoint"):
        loads(b"garbage")
    with pytest.raises(ValueError, match="cut short"):
        loads(dumps({"a": np.ones(100)})[:200])


def test_buffers_reused_across_versions_of_changing_sizes_hold_each_version_whole() -> None:
    def body(comm: Communicator) -> list[bool]:
        ck = Checkpointer(comm)
        good = []
        for step, n in enumerate([10, 5, 20, 5, 5, 30]):
            ck.checkpoint({"w": np.full(n * (comm.rank + 1), step, np.int64)})
            previous = (comm.rank - 1) % comm.size
            mine, theirs = ck.load()["w"], ck.replica_of(previous)["w"]
            good.append(
                bool(np.array_equal(mine, np.full(n * (comm.rank + 1), step)))
                and bool(np.array_equal(theirs, np.full(n * (previous + 1), step)))
            )
        return good

    assert all(all(flags) for flags in run_ranks(3, body))


def test_a_rank_failing_mid_checkpoint_leaves_every_survivor_a_version_they_all_hold() -> None:
    arm("1:checkpoint:1:raise")  # rank 1's second checkpoint: sizes agreed, no copy sent

    def body(comm: Communicator) -> tuple[str, int, Any]:
        ck = Checkpointer(comm)
        ck.checkpoint({"rank": comm.rank, "step": 0})
        try:
            ck.checkpoint({"rank": comm.rank, "step": 1})
            outcome = "done"  # rank 0 may finish: it needs only rank 2's copy
        except InjectedFault:
            outcome = "injected"
        except BrokenCommunicatorError as error:
            outcome = f"broken by {error.rank}"
        if ck.version == 2:
            assert ck.roll_back() == 1
            with pytest.raises(CheckpointError, match="keeps no version before 1"):
                ck.roll_back()
        lost = ck.replica_of(1) if comm.rank == 2 else None
        return outcome, ck.version, (ck.load(), lost)

    outcomes = run_ranks(3, body, timeout=20.0)
    assert outcomes[1][0] == "injected" and outcomes[2][0] == "broken by 1"
    assert outcomes[0][0] in ("done", "broken by 1")
    for rank, (_, version, (mine, _)) in enumerate(outcomes):
        assert version == 1 and mine == {"rank": rank, "step": 0}
    assert outcomes[2][2][1] == {"rank": 1, "step": 0}  # rank 1's last state, on its holder


def test_a_call_whose_own_checks_failed_counts_as_the_flight_recorder_numbers_it() -> None:
    arm("0:2:raise")  # call 0 fails its checks on rank 0; call 1 runs; call 2 is the fault's

    def body(comm: Communicator) -> str:
        x = np.ones(4, np.float32)
        with pytest.raises(CollectivesError):  # rank 0's own error; rank 1's PeerInputError
            allreduce(x, out=np.ones(3, np.float32) if comm.rank == 0 else None, comm=comm)
        allreduce(x, comm=comm)
        try:
            allreduce(x, comm=comm)
        except InjectedFault as error:
            return str(error)
        except BrokenCommunicatorError as error:
            return f"broken by {error.rank}"
        return "done"

    outcomes = run_ranks(2, body, timeout=20.0)
    assert outcomes[0].endswith("raise at allreduce #2") and outcomes[1] == "broken by 0"


def _import_with(fault: str) -> subprocess.CompletedProcess[str]:
    code = "from collectives.faults import PLAN; print(PLAN.armed, *PLAN.faults)"
    env = {**os.environ, "COLLECTIVES_FAULT": fault}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_the_variable_is_read_at_import_and_a_bad_one_stops_the_import_naming_it() -> None:
    armed = _import_with("1:3:exit,0:checkpoint:2")
    assert armed.returncode == 0 and armed.stdout.split() == ["True", "1:3:exit", "0:checkpoint:2:kill"]
    bad = _import_with("1:three")
    assert bad.returncode != 0 and "COLLECTIVES_FAULT: '1:three' is not RANK:NUMBER" in bad.stderr
