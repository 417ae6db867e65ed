"""The simulator: verifying schedules against their contracts and rejecting broken ones."""

from dataclasses import replace

import pytest

from collectives import ScheduleError
from collectives.algorithms import ring
from collectives.schedule import Schedule, Step, Transfer
from collectives.simulate import simulate


def _without(schedule: Schedule, step: int, index: int) -> Schedule:
    steps = list(schedule.steps)
    transfers = list(steps[step].transfers)
    del transfers[index]
    steps[step] = Step(transfers)
    return replace(schedule, steps=tuple(steps))


def _with_extra(schedule: Schedule, step: int, transfer: Transfer) -> Schedule:
    steps = list(schedule.steps)
    steps[step] = Step((*steps[step].transfers, transfer))
    return replace(schedule, steps=tuple(steps))


def test_a_missing_transfer_names_the_rank_and_chunk_left_short() -> None:
    broken = _without(ring.allreduce(4, 8), step=1, index=2)  # rank 2 -> 3 in step 1
    with pytest.raises(ScheduleError) as caught:
        simulate(broken)
    error = caught.value
    assert error.rank is not None and error.chunk is not None
    assert f"rank {error.rank} ends with chunk {error.chunk}" in str(error)
    assert error.expected == frozenset((r, error.chunk) for r in range(4))
    assert error.actual != error.expected


def test_a_missing_reduce_scatter_transfer_names_the_owner() -> None:
    broken = _without(ring.reduce_scatter((2, 2, 2)), step=0, index=0)  # 0 -> 1 carries chunk 2
    with pytest.raises(
        ScheduleError, match="rank 2 ends with chunk 2 holding contributions of ranks"
    ) as caught:
        simulate(broken)
    assert (caught.value.rank, caught.value.chunk) == (2, 2)


def test_a_chunk_reduced_twice_is_named() -> None:
    schedule = ring.allreduce(3, 3)
    # rank 1 passes chunk 0 to rank 2 again in step 1, after rank 2 already added it
    broken = _with_extra(schedule, 1, Transfer(0, 2, 2, reduce=True))
    twice = r"rank 2 reduces chunk 2 twice: contributions of ranks \{0\} would be counted twice"
    with pytest.raises(ScheduleError, match=twice) as caught:
        simulate(broken)
    assert (caught.value.step, caught.value.rank, caught.value.chunk) == (1, 2, 2)


def test_sending_a_chunk_before_holding_it_is_named() -> None:
    schedule = ring.allgather((1, 1, 1))
    # a first step in which rank 0 passes on chunk 2, which it has not received yet
    broken = replace(schedule, steps=(Step([Transfer(0, 1, 2)]), *schedule.steps))
    with pytest.raises(ScheduleError, match="step 0: rank 0 sends chunk 2 before it holds any data"):
        simulate(broken)


def test_reducing_in_allgather_is_rejected() -> None:
    schedule = ring.allgather((1, 1))
    broken = replace(schedule, steps=(Step([Transfer(0, 1, 0, reduce=True)]),))
    with pytest.raises(ScheduleError, match="allgather does not reduce"):
        simulate(broken)


def test_a_schedule_with_no_steps_fails_unless_one_rank_suffices() -> None:
    assert simulate(ring.allreduce(1, 5)).steps == 0
    empty = replace(ring.allreduce(2, 5), steps=())
    with pytest.raises(ScheduleError, match=r"rank 0 ends with chunk 0 holding contributions of ranks \{0\}"):
        simulate(empty)


def test_shares_must_be_contiguous_in_rank_order() -> None:
    schedule = replace(ring.allgather((1, 1)), chunk_owner=(1, 0))
    with pytest.raises(ScheduleError, match="not in rank order"):
        simulate(schedule)
    with pytest.raises(ScheduleError, match="must give each chunk's owner"):
        simulate(replace(ring.allgather((1, 1)), chunk_owner=None))


def test_counts_messages_and_elements() -> None:
    result = simulate(ring.allreduce(4, 10))  # chunks of 3, 3, 2, 2
    assert result.steps == 6
    assert result.messages_sent == (6, 6, 6, 6)
    assert result.elements_sent == (20 - 3 - 3, 20 - 3 - 2, 20 - 2 - 2, 20 - 2 - 3)
    assert result.elements_received == (20 - 3 - 2, 20 - 3 - 3, 20 - 3 - 2, 20 - 2 - 2)
    assert result.bytes_sent(4) == tuple(4 * n for n in result.elements_sent)


def test_a_transfer_into_another_chunk_is_tracked_by_origin() -> None:
    # rank 0's chunk 0 lands in rank 1's chunk 1, overwriting rank 1's own share
    moved = Schedule("move", "allgather", 2, (2, 2), (Step([Transfer(0, 1, 0, dst_chunk=1)]),), (0, 1))
    with pytest.raises(ScheduleError, match="rank 0 ends with chunk 1 holding no data"):
        simulate(moved)
    # passing rank 1's chunk 1 on now passes rank 0's data, and the check says so
    with pytest.raises(ScheduleError, match=r"rank 0 ends with chunk 1 holding rank 0's chunk 0, expected"):
        simulate(replace(moved, steps=(*moved.steps, Step([Transfer(1, 0, 1)]))))
    swapped = replace(moved, steps=(Step([Transfer(0, 1, 0)]), Step([Transfer(1, 0, 1, dst_chunk=0)])))
    with pytest.raises(ScheduleError, match="rank 0 ends with chunk 0 holding rank 1's chunk 1, expected"):
        simulate(swapped)
