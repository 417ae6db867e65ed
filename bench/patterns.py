"""Exact inputs and expected results of each collective, as numpy arrays."""

__all__ = ["ExactData", "count_wrong", "input_count", "numpy_dtype"]

from dataclasses import dataclass

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np

from collectives.ops import FLOAT_DTYPES, get_op
from collectives.specs import ExactPattern, exact_pattern, get_spec

# allgather does not reduce; the prod pattern (one 2 among P ones) is rotated
# differently on every rank, so a rank's contribution in the wrong place shows
_GATHER_PATTERN_OP = "prod"


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of a dtype name, bfloat16 included."""
    return np.dtype(name)


def input_count(collective: str, count: int, world_size: int) -> int:
    """Elements of one rank's input, for a full buffer of ``count`` elements."""
    return count // world_size if collective == "allgather" else count


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
        pattern: the exact pattern of the op (of ``prod`` for allgather, which has none).
        dtype: the element type.
        world_size: the number of ranks.
        averages: whether the result is divided by the world size.
    """

    collective: str
    pattern: ExactPattern
    dtype: np.dtype
    world_size: int
    averages: bool

    @classmethod
    def of(cls, collective: str, op: str | None, dtype: str, world_size: int) -> "ExactData":
        """The data of ``collective`` reducing with ``op`` (ignored where it does not reduce)."""
        if not get_spec(collective).reduces:
            op = _GATHER_PATTERN_OP
        elif op is None:
            raise ValueError(f"{collective} needs an op")
        pattern = exact_pattern(op, world_size)
        return cls(collective, pattern, numpy_dtype(dtype), world_size, get_op(op).averages)

    def rank_input(self, rank: int, count: int) -> np.ndarray:
        """Rank ``rank``'s input for a full buffer of ``count`` elements.

        Element ``i`` of the input is ``values[(i + rank) % period]``; for
        reduce_scatter ``i`` runs over all ``count`` elements, for allgather over
        the rank's own ``count / P``.
        """
        elements = input_count(self.collective, count, self.world_size)
        return _cycle(self.pattern.values, self.dtype, rank, elements)

    def expected(self, rank: int, count: int) -> np.ndarray:
        """What rank ``rank`` must end with, for a full buffer of ``count`` elements."""
        if self.collective == "allgather":
            peers = range(self.world_size)
            return np.concatenate([self.rank_input(peer, count) for peer in peers])
        if self.collective == "reduce_scatter":
            share = count // self.world_size
            return self._reduced(rank * share, share)
        return self._reduced(0, count)

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
