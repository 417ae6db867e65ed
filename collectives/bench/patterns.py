"""Exact inputs and expected results of each collective, as numpy arrays."""

__all__ = ["ExactData", "count_wrong", "input_count", "numpy_dtype"]

from dataclasses import dataclass

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np

from collectives.ops import FLOAT_DTYPES, get_op
from collectives.specs import ExactPattern, exact_pattern, get_spec

# The collectives that only move data take 101 distinct values, each rank starting 31 further on:
# no two of up to 101 ranks hold the same value at an element, and the prime period makes two
# shares of one rank's input (scatter's, alltoall's) alike only when their offsets differ by 101k.
_MOVED = ExactPattern(values=tuple(7 * i % 101 for i in range(101)), combined=())
_MOVED_STRIDE = 31


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name, bfloat16 included."""
    return np.dtype(name)


def input_count(collective: str, count: int, world_size: int) -> int:
    """Elements of one rank's input, for a full buffer of ``count`` elements."""
    return count // world_size if collective in ("allgather", "gather") else count


def _cycle(values: tuple[int, ...], dtype: np.dtype, start: int, count: int) -> np.ndarray:
    """``values[(i + start) % len(values)]`` for ``i < count``, in ``dtype``."""
    period = len(values)
    rotated = np.take(np.asarray(values).astype(dtype), (np.arange(period) + start) % period)
    # repeating one period, rather than indexing every element, keeps memory at one buffer
    return np.resize(rotated, count)


@dataclass(frozen=True)
class ExactData:
    """Integer-valued inputs of a collective and the results they must give, exactly.

    Attributes:
        collective: the collective's name.
        pattern: the exact pattern of the op; for the collectives that only
            move data, 101 distinct values with nothing combined.
        dtype: the element type.
        world_size: the number of ranks.
        averages: whether the result is divided by the world size.
        root: the root of a rooted collective.
        stride: how much further on in the pattern each rank starts than the one before.
    """

    collective: str
    pattern: ExactPattern
    dtype: np.dtype
    world_size: int
    averages: bool
    root: int = 0
    stride: int = 1

    @classmethod
    def of(cls, collective: str, op: str | None, dtype: str, world_size: int, root: int = 0) -> "ExactData":
        """The data of ``collective`` reducing with ``op`` (ignored where it does not reduce)."""
        spec = get_spec(collective)
        if not (spec.reduces and spec.carries_data):
            return cls(collective, _MOVED, numpy_dtype(dtype), world_size, False, root, _MOVED_STRIDE)
        if op is None:
            raise ValueError(f"{collective} needs an op")
        pattern = exact_pattern(op, world_size)
        return cls(collective, pattern, numpy_dtype(dtype), world_size, get_op(op).averages, root)

    def rank_input(self, rank: int, count: int) -> np.ndarray:
        """Rank ``rank``'s input for a full buffer of ``count`` elements.

        Element ``i`` of the input is ``values[(i + stride * rank) % period]``;
        ``i`` runs over all ``count`` elements, except for allgather and gather,
        where it runs over the rank's own ``count / P``.
        """
        elements = input_count(self.collective, count, self.world_size)
        return self._input(rank, 0, elements)

    def expected(self, rank: int, count: int) -> np.ndarray | None:
        """What rank ``rank`` must end with, for a full buffer of ``count`` elements.

        ``None`` where the rank gets no result: off the root of reduce and
        gather, and everywhere for the barrier.
        """
        size, root = self.world_size, self.root
        share = count // size
        off_root = rank != root
        match self.collective:
            case "allreduce":
                return self._reduced(0, count)
            case "reduce_scatter":
                return self._reduced(rank * share, share)
            case "reduce":
                return None if off_root else self._reduced(0, count)
            case "allgather":
                return np.concatenate([self._input(peer, 0, share) for peer in range(size)])
            case "gather":
                return None if off_root else np.concatenate([self._input(p, 0, share) for p in range(size)])
            case "broadcast":
                return self._input(root, 0, count)
            case "scatter":
                return self._input(root, rank * share, share)
            case "alltoall":
                return np.concatenate([self._input(peer, rank * share, share) for peer in range(size)])
        return None

    def _input(self, rank: int, start: int, count: int) -> np.ndarray:
        """Elements ``start`` to ``start + count`` of rank ``rank``'s input."""
        return _cycle(self.pattern.values, self.dtype, self.stride * rank + start, count)

    def _reduced(self, start: int, count: int) -> np.ndarray:
        """Elements ``start`` to ``start + count`` of the reduced full buffer."""
        result = _cycle(self.pattern.combined, self.dtype, start, count)
        if self.averages:
            # as the library does: divide the exact sum by P in the dtype itself
            np.true_divide(result, self.world_size, out=result)
        return result


def count_wrong(actual: np.ndarray, expected: np.ndarray) -> int:
    """Elements that differ bit for bit, counting two NaNs as equal."""
    actual, expected = actual.reshape(-1), expected.reshape(-1)
    bits = np.dtype(f"u{actual.dtype.itemsize}")
    differ = actual.view(bits) != expected.view(bits)
    if actual.dtype.name in FLOAT_DTYPES:
        differ &= ~(np.isnan(actual) & np.isnan(expected))
    return int(np.count_nonzero(differ))
