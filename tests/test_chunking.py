"""Chunking: even splits, bounds and segments."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collectives.chunking import bounds, even_split, segments


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
