"""Chunking: even splits, bounds and segments."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectives.chunking import bounds, even_split, segments, weighted_split


@given(st.integers(0, 10_000), st.integers(1, 100))
def test_even_split_covers_count_with_sizes_differing_by_at_most_one(count: int, parts: int) -> None:
    sizes = even_split(count, parts)
    assert len(sizes) == parts
    assert sum(sizes) == count
    assert max(sizes) - min(sizes) <= 1
    assert list(sizes) == sorted(sizes, reverse=True)  # the larger parts come first


def test_even_split_gives_extra_elements_to_the_first_parts() -> None:
    assert even_split(10, 4) == (3, 3, 2, 2)
    assert even_split(2, 4) == (1, 1, 0, 0)
    assert even_split(0, 3) == (0, 0, 0)


@pytest.mark.parametrize(("count", "parts"), [(-1, 2), (5, 0)])
def test_even_split_rejects_bad_arguments(count: int, parts: int) -> None:
    with pytest.raises(ValueError, match="must be"):
        even_split(count, parts)


def test_bounds_are_running_offsets() -> None:
    assert bounds((3, 0, 2)) == (0, 3, 3, 5)
    assert bounds(()) == (0,)


@given(st.integers(0, 1000), st.integers(0, 1000), st.integers(1, 64))
def test_segments_tile_the_range(start: int, length: int, size: int) -> None:
    pieces = list(segments(start, start + length, size))
    assert all(0 < hi - lo <= size for lo, hi in pieces)
    assert [lo for lo, _ in pieces] == list(range(start, start + length, size))
    assert (pieces[-1][1] if pieces else start) == start + length


@given(st.integers(0, 10_000), st.lists(st.floats(0.01, 100.0), min_size=1, max_size=8))
def test_weighted_split_covers_count_within_one_of_each_quota(count: int, weights: list[float]) -> None:
    sizes = weighted_split(count, weights)
    assert sum(sizes) == count
    total = sum(weights)
    assert all(abs(size - count * w / total) < 1 + 1e-9 for size, w in zip(sizes, weights, strict=True))


@given(st.integers(0, 10_000), st.integers(1, 50))
def test_weighted_split_with_equal_weights_is_the_even_split(count: int, parts: int) -> None:
    assert weighted_split(count, [2.5] * parts) == even_split(count, parts)


def test_weighted_split_gives_the_leftover_to_the_largest_remainders() -> None:
    assert weighted_split(10, (2, 1)) == (7, 3)
    assert weighted_split(5_000_000, (36e9, 18e9)) == (3_333_333, 1_666_667)
    assert weighted_split(0, (1, 3)) == (0, 0)


@pytest.mark.parametrize(("count", "weights"), [(-1, (1,)), (3, ()), (3, (1, 0)), (3, (1, float("inf")))])
def test_weighted_split_rejects_bad_arguments(count: int, weights: tuple[float, ...]) -> None:
    with pytest.raises(ValueError, match="must be"):
        weighted_split(count, weights)
