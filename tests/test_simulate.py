"""The simulator: verifying schedules against their contracts and rejecting broken ones."""

from dataclasses import replace

import pytest

from collectives import ScheduleError
from collectives.algorithms import direct, dissemination, ring
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


def test_a_broadcast_that_skips_a_rank_names_it() -> None:
    broken = _without(direct.broadcast(4, 6, root=2), step=0, index=1)  # 2 -> 1
    with pytest.raises(ScheduleError, match="rank 1 ends with chunk 0 holding no data") as caught:
        simulate(broken)
    assert caught.value.expected == frozenset({(2, 0)})


def test_a_broadcast_from_the_wrong_rank_is_caught() -> None:
    # rank 0 holds no data when the root is 1
    moved = replace(direct.broadcast(3, 6, root=0), root=1)
    with pytest.raises(ScheduleError, match="step 0: rank 0 sends chunk 0 before it holds any data"):
        simulate(moved)


def test_a_reduce_short_a_contribution_names_the_root() -> None:
    broken = _without(direct.reduce(4, 6, root=3), step=0, index=0)  # 0 -> 3
    with pytest.raises(
        ScheduleError, match=r"rank 3 ends with chunk 0 holding contributions of ranks \{1, 2, 3\}"
    ):
        simulate(broken)


def test_only_the_root_of_reduce_and_gather_is_checked() -> None:
    # the other ranks may end with anything: here rank 0 also reduces rank 1's buffer
    extra = _with_extra(direct.reduce(3, 2, root=2), 0, Transfer(1, 0, 0, reduce=True))
    assert simulate(extra).steps == 1
    gather = _with_extra(direct.gather((1, 1, 1), root=0), 0, Transfer(0, 2, 0))
    assert simulate(gather).steps == 1


def test_a_scatter_into_the_wrong_chunk_is_named() -> None:
    schedule = direct.scatter((2, 2, 2), root=0)
    swapped = Step([Transfer(0, 1, 2, dst_chunk=1), Transfer(0, 2, 1, dst_chunk=2)])
    with pytest.raises(
        ScheduleError,
        match=r"rank 1 ends with chunk 1 holding rank 0's chunk 2, expected contributions of ranks \{0\}",
    ) as caught:
        simulate(replace(schedule, steps=(swapped,)))
    assert (caught.value.rank, caught.value.chunk) == (1, 1)


def test_an_alltoall_share_in_the_wrong_slot_is_named() -> None:
    schedule = direct.alltoall(3, 3)  # chunks 0..2 the input, 3..5 the output
    first = list(schedule.steps[0].transfers)
    assert first[0] == Transfer(0, 1, 1, dst_chunk=3)
    first[0] = Transfer(0, 1, 1, dst_chunk=4)  # over rank 1's share for itself
    broken = replace(schedule, steps=(Step(first), *schedule.steps[1:]))
    with pytest.raises(
        ScheduleError, match="rank 1 ends with chunk 3 holding no data, expected rank 0's chunk 1"
    ):
        simulate(broken)


def test_a_barrier_rank_that_has_not_heard_from_all_is_named() -> None:
    broken = _without(dissemination.barrier(5), step=2, index=4)  # 4 -> 3 in the last round
    with pytest.raises(
        ScheduleError, match=r"rank 3 ends with chunk 0 holding contributions of ranks \{0, 1, 2, 3\}"
    ):
        simulate(broken)


def test_hearing_twice_is_harmless_in_a_barrier_but_not_in_a_reduce() -> None:
    barrier = direct.barrier(3)
    again = Step([Transfer(1, 2, 0, reduce=True)])  # rank 2 has heard from everyone already
    assert simulate(replace(barrier, steps=(*barrier.steps, again))).steps == 3
    broken = _with_extra(direct.reduce(3, 1, root=0), 0, Transfer(2, 1, 0, reduce=True))
    broken = replace(broken, steps=(*broken.steps, Step([Transfer(1, 0, 0, reduce=True)])))
    with pytest.raises(ScheduleError, match=r"rank 0 reduces chunk 0 twice: contributions of ranks \{1, 2\}"):
        simulate(broken)
