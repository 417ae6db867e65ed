"""The schedule data model: structure checks and per-rank programs."""

import pytest

from collectives import ScheduleError
from collectives.algorithms import ring
from collectives.schedule import RankStep, Schedule, Step, Transfer, share_schedule


def _schedule(*steps: Step, world_size: int = 3, chunks: int = 3) -> Schedule:
    return Schedule("test", "allreduce", world_size, (2,) * chunks, tuple(steps))


def test_program_derives_each_ranks_sends_and_receives_from_the_global_view() -> None:
    schedule = ring.allreduce(3, 6)
    for rank in range(3):
        program = schedule.program(rank)
        assert len(program) == len(schedule.steps) == 4
        for step, mine in zip(schedule.steps, program, strict=True):
            assert mine == RankStep(
                sends=tuple(t for t in step.transfers if t.src == rank),
                recvs=tuple(t for t in step.transfers if t.dst == rank),
            )
            # in a ring every rank sends one chunk right and receives one from the left
            assert [t.dst for t in mine.sends] == [(rank + 1) % 3]
            assert [t.src for t in mine.recvs] == [(rank - 1) % 3]
    assert schedule.program(1) is schedule.program(1)


def test_chunk_ranges_follow_the_sizes() -> None:
    schedule = ring.allreduce(4, 10)
    assert schedule.chunk_sizes == (3, 3, 2, 2)
    assert [schedule.chunk_range(c) for c in range(4)] == [(0, 3), (3, 6), (6, 8), (8, 10)]
    assert schedule.count == 10


def test_name_carries_the_parameters() -> None:
    assert ring.allreduce(8, 100).name == "allreduce-ring(n=8)"
    assert ring.reduce_scatter((1, 2)).name == "reduce_scatter-ring(n=2)"


@pytest.mark.parametrize(
    ("transfer", "message"),
    [
        (Transfer(0, 3, 0), "names a rank outside 0..2"),
        (Transfer(-1, 0, 0), "names a rank outside 0..2"),
        (Transfer(1, 1, 0), "rank 1 sends chunk 0 to itself"),
        (Transfer(0, 1, 3), "chunk 3 outside 0..2"),
    ],
)
def test_out_of_range_transfers_are_rejected(transfer: Transfer, message: str) -> None:
    with pytest.raises(ScheduleError, match=message) as caught:
        _schedule(Step([transfer]))
    assert caught.value.step == 0


@pytest.mark.parametrize(
    "transfers",
    [
        # two overwrites of one chunk in one step
        [Transfer(0, 2, 1), Transfer(1, 2, 1)],
        # an overwrite and a reduction of the same chunk
        [Transfer(0, 2, 1, reduce=True), Transfer(1, 2, 1)],
        # overwriting a chunk the rank is sending in the same step
        [Transfer(2, 0, 1), Transfer(1, 2, 1)],
        [Transfer(1, 2, 1), Transfer(2, 0, 1)],
    ],
)
def test_a_chunk_overwritten_while_in_use_in_the_same_step_is_rejected(
    transfers: list[Transfer],
) -> None:
    with pytest.raises(ScheduleError, match="chunk 1") as caught:
        _schedule(Step(transfers))
    assert caught.value.rank == 2


def test_reductions_and_sends_of_one_chunk_may_share_a_step() -> None:
    # sends read the step's starting value, so exchanging and reducing at once is fine
    _schedule(Step([Transfer(0, 1, 0, reduce=True), Transfer(1, 0, 0, reduce=True)]))


def test_bad_world_size_and_owners_are_rejected() -> None:
    with pytest.raises(ScheduleError, match="world size must be at least 1"):
        Schedule("x", "allreduce", 0, (), ())
    with pytest.raises(ScheduleError, match="2 chunk owners for 3 chunks"):
        Schedule("x", "allgather", 2, (1, 1, 1), (), chunk_owner=(0, 1))
    with pytest.raises(ScheduleError, match="negative chunk size"):
        Schedule("x", "allreduce", 2, (1, -1), ())
    with pytest.raises(ScheduleError, match="rank 5 is outside world size 3"):
        ring.allreduce(3, 3).program(5)


@pytest.mark.parametrize("root", [-1, 3])
def test_a_root_outside_the_world_is_rejected(root: int) -> None:
    with pytest.raises(ScheduleError, match=rf"x: root {root} outside 0\.\.2") as caught:
        Schedule("x", "broadcast", 3, (1,), (), root=root)
    assert caught.value.rank == root


def test_a_transfer_may_land_in_another_chunk_of_the_same_size() -> None:
    schedule = _schedule(Step([Transfer(0, 1, 0, dst_chunk=2)]))
    (landing,) = schedule.program(1)[0].recvs
    assert (landing.chunk, landing.into) == (0, 2)
    with pytest.raises(ScheduleError, match="chunk 0 of 2 elements lands in chunk 1 of 3"):
        Schedule("x", "allreduce", 2, (2, 3), (Step([Transfer(0, 1, 0, dst_chunk=1)]),))
    with pytest.raises(ScheduleError, match=r"chunk 9 outside 0\.\.2"):
        _schedule(Step([Transfer(0, 1, 0, dst_chunk=9)]))


@pytest.mark.parametrize(
    "schedule",
    [
        ring.allreduce(5, 13),
        ring.reduce_scatter((3, 0, 2)),
        ring.allgather((1, 1)),
        ring.allreduce(1, 0),
        Schedule("moved", "allgather", 2, (1, 1), (Step([Transfer(0, 1, 0, dst_chunk=1)]),), (0, 1)),
        Schedule("rooted", "broadcast", 3, (4,), (Step([Transfer(2, 0, 0), Transfer(2, 1, 0)]),), root=2),
    ],
    ids=lambda s: s.name,
)
def test_schedules_survive_a_json_round_trip(schedule: Schedule) -> None:
    again = Schedule.from_json(schedule.to_json())
    assert again == schedule
    assert again.root == schedule.root
    assert again.to_json() == schedule.to_json()


def test_a_share_schedule_gives_rank_r_chunk_r_and_names_its_parameters() -> None:
    steps = [Step([Transfer(0, 1, 0)])]
    rooted = share_schedule("gather", "direct", [3, 1], iter(steps), root=1)
    assert rooted == Schedule(
        name="gather-direct(n=2, root=1)",
        collective="gather",
        world_size=2,
        chunk_sizes=(3, 1),
        steps=tuple(steps),
        chunk_owner=(0, 1),
        root=1,
    )
    plain = share_schedule("allgather", "ring", (2, 0, 5), [])
    assert (plain.name, plain.chunk_owner, plain.chunk_sizes, plain.root) == (
        "allgather-ring(n=3)",
        (0, 1, 2),
        (2, 0, 5),
        None,
    )
    # the algorithms that build their share schedules with it give the same schedule as before
    assert ring.allgather([1, 2, 3]).name == "allgather-ring(n=3)" and ring.allgather(
        [1, 2, 3]
    ).chunk_owner == (0, 1, 2)
