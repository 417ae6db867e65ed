"""The collectives' contracts and their exact test patterns."""

import numpy as np
import pytest

from collectives import COLLECTIVES, OPS, InvalidRootError, ScheduleError
from collectives.schedule import Schedule
from collectives.specs import check_root, exact_pattern, get_spec

_NUMPY_REDUCE = {
    "sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
    "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor,
}  # fmt: skip


def test_collectives_are_named_alike_everywhere() -> None:
    assert COLLECTIVES == (
        "allreduce", "reduce_scatter", "allgather",
        "broadcast", "reduce", "gather", "scatter", "alltoall", "barrier",
    )  # fmt: skip
    with pytest.raises(ValueError, match="unknown collective 'allscatter'"):
        get_spec("allscatter")
    rooted = [name for name in COLLECTIVES if get_spec(name).rooted]
    assert rooted == ["broadcast", "reduce", "gather", "scatter"]


@pytest.mark.parametrize(
    ("collective", "world_size", "factor"),
    [
        ("allreduce", 4, 1.5),
        ("allreduce", 1, 0.0),
        ("reduce_scatter", 8, 0.875),
        ("allgather", 2, 0.5),
        ("broadcast", 8, 1.0),
        ("reduce", 3, 1.0),
        ("gather", 4, 0.75),
        ("scatter", 5, 0.8),
        ("alltoall", 8, 0.875),
        ("alltoall", 1, 0.0),
        ("barrier", 4, 0.0),
    ],
)
def test_bus_bandwidth_factor_is_the_nccl_tests_one(collective: str, world_size: int, factor: float) -> None:
    assert get_spec(collective).busbw_factor(world_size) == pytest.approx(factor)


@pytest.mark.parametrize("world_size", [1, 2, 3, 5, 8, 17, 42])
@pytest.mark.parametrize("op", [name for name in OPS if name != "avg"])
def test_exact_pattern_reduces_to_its_combined_values(op: str, world_size: int) -> None:
    pattern = exact_pattern(op, world_size)
    period = len(pattern.values)
    index = np.arange(3 * period + 1)
    inputs = [np.take(pattern.values, (index + r) % period) for r in range(world_size)]
    combined = _NUMPY_REDUCE[OPS[op].combine].reduce(np.stack(inputs), axis=0)
    assert np.array_equal(combined, np.take(pattern.combined, index % period))
    # every partial result fits int8 and is an exact bfloat16 integer
    assert min(pattern.values) >= 0 and max(pattern.combined) <= np.iinfo(np.int8).max


def _tokens(*pairs: tuple[int, int]) -> frozenset[tuple[int, int]]:
    return frozenset(pairs)


def test_rooted_conditions_follow_the_root() -> None:
    broadcast = Schedule("b", "broadcast", 3, (2, 2), (), root=1)
    assert get_spec("broadcast").before(broadcast) == [
        [None, None],
        [_tokens((1, 0)), _tokens((1, 1))],
        [None, None],
    ]
    scatter = Schedule("s", "scatter", 3, (1, 1, 1), (), chunk_owner=(0, 1, 2), root=2)
    assert get_spec("scatter").before(scatter)[2] == [_tokens((2, c)) for c in range(3)]
    assert get_spec("scatter").before(scatter)[0] == [None] * 3
    gather = Schedule("g", "gather", 2, (1, 1), (), chunk_owner=(0, 1), root=0)
    assert get_spec("gather").before(gather) == [[_tokens((0, 0)), None], [None, _tokens((1, 1))]]


def test_alltoall_starts_with_the_input_and_the_share_for_itself_in_the_output_half() -> None:
    schedule = Schedule("a", "alltoall", 2, (3,) * 4, ())
    assert get_spec("alltoall").before(schedule) == [
        [_tokens((0, 0)), _tokens((0, 1)), _tokens((0, 0)), None],
        [_tokens((1, 0)), _tokens((1, 1)), None, _tokens((1, 1))],
    ]
    # nothing moved: rank 0's output chunk 3 should hold rank 1's share for rank 0
    with pytest.raises(ScheduleError, match="rank 0 ends with chunk 3 holding no data") as caught:
        get_spec("alltoall").check_after(schedule, get_spec("alltoall").before(schedule))
    assert caught.value.expected == _tokens((1, 0))


@pytest.mark.parametrize(
    ("schedule", "message"),
    [
        (Schedule("b", "broadcast", 2, (1,), ()), "b: a broadcast schedule must name its root"),
        (
            Schedule("a", "allreduce", 2, (1,), (), root=0),
            "a: allreduce has no root, yet the schedule names 0",
        ),
        (Schedule("t", "alltoall", 2, (1,) * 3, ()), "alltoall schedule over 2 ranks has 4 chunks, not 3"),
        (Schedule("w", "barrier", 2, (2,), ()), r"barrier chunks hold one element each, not \(2,\)"),
        (Schedule("z", "barrier", 2, (0,), ()), r"barrier chunks hold one element each, not \(0,\)"),
        (Schedule("g", "gather", 2, (1, 1), (), root=0), "g: a gather schedule must give each chunk's owner"),
    ],
)
def test_layouts_that_do_not_fit_the_collective_are_named(schedule: Schedule, message: str) -> None:
    with pytest.raises(ScheduleError, match=message):
        get_spec(schedule.collective).check_layout(schedule)


def test_check_root_names_the_root_and_the_valid_range() -> None:
    assert check_root(np.int64(2), 3) == 2
    for root in (-1, 3):
        with pytest.raises(InvalidRootError, match=rf"root {root} is not a rank: valid roots are 0\.\.2"):
            check_root(root, 3)
    with pytest.raises(InvalidRootError, match=r"root must be an integer rank, got 1\.5"):
        check_root(1.5, 3)  # type: ignore[arg-type]
