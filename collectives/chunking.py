"""Splitting a count of elements into chunks and segments."""

__all__ = ["bounds", "even_split", "segments"]

from collections.abc import Iterator, Sequence
from itertools import accumulate


def even_split(count: int, parts: int) -> tuple[int, ...]:
    """Split ``count`` elements into ``parts`` sizes that differ by at most one.

    The first ``count % parts`` parts get the extra element, as MPI's block
    distributions do.

    >>> even_split(10, 4)
    (3, 3, 2, 2)
    """
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    base, extra = divmod(count, parts)
    return tuple(base + 1 if i < extra else base for i in range(parts))


def bounds(sizes: Sequence[int]) -> tuple[int, ...]:
    """Offsets of consecutive parts of the given sizes: ``len(sizes) + 1`` values from 0.

    >>> bounds((3, 3, 2))
    (0, 3, 6, 8)
    """
    return (0, *accumulate(sizes))


def segments(start: int, stop: int, segment_size: int) -> Iterator[tuple[int, int]]:
    """Yield ``(start, stop)`` of consecutive segments of at most ``segment_size`` elements."""
    if segment_size < 1:
        raise ValueError(f"segment_size must be at least 1, got {segment_size}")
    for lo in range(start, stop, segment_size):
        yield lo, min(lo + segment_size, stop)
