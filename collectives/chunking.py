"""Splitting a count of elements into chunks and segments."""

__all__ = ["bounds", "even_split", "segments", "weighted_split"]

from collections.abc import Iterator, Sequence
from fractions import Fraction
from itertools import accumulate
from math import floor, isfinite


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


def weighted_split(count: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Split ``count`` elements into sizes proportional to ``weights`` (largest remainder).

    Each part gets the whole elements of its exact quota; the elements left go
    to the parts with the largest remainders, the earlier part on a tie, so
    equal weights give :func:`even_split`. Exact for float weights.

    >>> weighted_split(10, (2, 1))
    (7, 3)
    """
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    if not weights or any(not (isfinite(w) and w > 0) for w in weights):
        raise ValueError(f"weights must be positive and finite, got {tuple(weights)}")
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [count * w / total for w in exact]
    sizes = [floor(q) for q in quotas]
    by_remainder = sorted(range(len(sizes)), key=lambda i: (sizes[i] - quotas[i], i))
    for i in by_remainder[: count - sum(sizes)]:
        sizes[i] += 1
    return tuple(sizes)


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
