"""``ReproducibleSum``: many contributions a rank, summed with the same bits however they are spread."""

__all__ = ["ReproducibleSum"]

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from . import api
from .communicator import Communicator, communicator_of
from .dispatch import checked, escaped
from .errors import InvalidBufferError, InvalidRootError, UnsupportedOpError
from .reproducible import Levels, family_of, float64_sums
from .reproducible_calls import Sum, Through, check_out, deliver, reduced, shares_of
from .selector import AUTO

if TYPE_CHECKING:
    from mpi4py import MPI

_THROUGH = Through(api.allreduce, api.reduce, api.reduce_scatter)


class ReproducibleSum:
    """A sum of float arrays whose bits depend only on the multiset of contributions.

    Each rank :meth:`add` s any number of arrays locally (no communication); then
    :meth:`allreduce` (or :meth:`reduce`, :meth:`reduce_scatter`) gives the sum of
    every contribution of every rank, rounded once. Twelve micro-batches' gradients
    added on 1, 2, 3, 4 or 6 ranks, however they are dealt, give the same bits, and
    the same as ``collectives.allreduce(x, reproducible=True)`` where each rank adds
    one. :meth:`value` is this rank's contributions' sum alone.

    The method and its error bound: :mod:`collectives.reproducible` and
    docs/determinism.md. At most 32768 contributions in all (the busiest rank's
    count, rounded up to a power of two, times the world size).

    Args:
        like: an array whose shape and dtype the contributions have (float16,
            bfloat16, float32 or float64 numpy arrays).
        shape: the contributions' shape, instead of ``like``.
        dtype: their dtype, instead of ``like``.

    Example:
        >>> import numpy as np
        >>> total = ReproducibleSum(like=np.zeros(3, np.float32))
        >>> for part in ([1e8, 1, -1e8], [1e-8, 2, 3]):
        ...     total.add(np.array(part, np.float32))
        >>> total.value()
        array([1.e-08, 3.e+00, 3.e+00], dtype=float32)
    """

    __slots__ = ("_levels", "dtype", "shape")

    def __init__(self, like: Any = None, *, shape: Sequence[int] | None = None, dtype: Any = None) -> None:
        if like is not None:
            if not isinstance(like, np.ndarray):
                raise InvalidBufferError(f"ReproducibleSum takes numpy arrays, not {type(like).__name__}")
            shape = like.shape if shape is None else shape
            dtype = like.dtype if dtype is None else dtype
        if shape is None or dtype is None:
            raise InvalidBufferError("ReproducibleSum needs like= or both shape= and dtype=")
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        family = family_of(self.dtype.name)
        self._levels = Levels(int(np.prod(self.shape)), family)

    @property
    def count(self) -> int:
        """The contributions added on this rank since it was made or reset."""
        return self._levels.adds

    def add(self, x: Any) -> None:
        """Add ``x`` (of the sum's shape and dtype) as one contribution; local."""
        if not isinstance(x, np.ndarray) or x.dtype != self.dtype or x.shape != self.shape:
            kind = f"{x.dtype} {x.shape}" if isinstance(x, np.ndarray) else type(x).__name__
            raise InvalidBufferError(f"ReproducibleSum of {self.dtype} {self.shape} cannot add a {kind}")
        self._levels.add(np.ascontiguousarray(x).reshape(-1))

    def reset(self) -> None:
        """Forget every contribution."""
        self._levels = Levels(self._levels.count, self._levels.family)

    def value(self, op: str = "sum", *, out: Any = None) -> Any:
        """The sum of this rank's contributions alone, rounded once; local.

        ``op="avg"``: their mean (the sum rounded to float64, divided by :attr:`count`,
        rounded to the dtype, as ``allreduce(..., "avg", reproducible=True)`` does).
        """
        if op not in ("sum", "avg"):
            raise UnsupportedOpError(f"ReproducibleSum: op must be 'sum' or 'avg', not {op!r}")
        check_out(out, self.dtype, self.shape)
        divide_by = max(self.count, 1) if op == "avg" else 1
        result = reduced(None, _THROUGH, "allreduce", self._sum(), divide_by=divide_by)
        assert result is not None
        return deliver(result, out, self.shape)

    def allreduce(
        self,
        op: str = "sum",
        *,
        out: Any = None,
        algorithm: str = AUTO,
        comm: "Communicator | MPI.Comm | None" = None,
        check: bool | None = None,
    ) -> Any:
        """The sum of every rank's contributions, on every rank; collective.

        Args:
            op: ``sum``, or ``avg`` (divided by the world size, as ``allreduce``'s).
            out: where to put it, of the sum's shape and dtype.
            algorithm: the algorithm of the words' allreduce, or ``"auto"``.
            comm: the communicator; see :mod:`collectives.api`.
            check: whether the ranks agree on each call first.
        """
        return self._collective("allreduce", op, out, algorithm, comm, check, self.shape)

    def reduce(
        self,
        root: int = 0,
        *,
        out: Any = None,
        algorithm: str = AUTO,
        comm: "Communicator | MPI.Comm | None" = None,
        check: bool | None = None,
    ) -> Any:
        """The sum of every rank's contributions at ``root`` (``None`` elsewhere); collective."""
        return self._collective("reduce", "sum", out, algorithm, comm, check, self.shape, root=root)

    def reduce_scatter(
        self,
        *,
        counts: Sequence[int] | None = None,
        out: Any = None,
        algorithm: str = AUTO,
        comm: "Communicator | MPI.Comm | None" = None,
        check: bool | None = None,
    ) -> Any:
        """This rank's share of every rank's contributions' sum, as :func:`~collectives.reduce_scatter`."""
        return self._collective("reduce_scatter", "sum", out, algorithm, comm, check, None, counts=counts)

    def _collective(
        self,
        collective: str,
        op: str,
        out: Any,
        algorithm: str,
        comm: "Communicator | MPI.Comm | None",
        check: bool | None,
        shape: tuple[int, ...] | None,
        *,
        root: int = 0,
        counts: Sequence[int] | None = None,
    ) -> Any:
        try:
            group = communicator_of(comm)

            def checks() -> tuple[list[int] | None, tuple[int, ...]]:
                if op not in ("sum", "avg"):
                    raise UnsupportedOpError(f"ReproducibleSum: op must be 'sum' or 'avg', not {op!r}")
                if collective == "reduce" and not (isinstance(root, int) and 0 <= root < group.size):
                    raise InvalidRootError(f"root {root!r} is not a rank of the {group.size} here")
                shares, result_shape = (None, self.shape)
                if shape is None:
                    shares, result_shape = shares_of(self.shape, counts, group.size, group.rank)
                check_out(out, self.dtype, result_shape)
                return shares, result_shape

            shares, result_shape = checked(group, collective, checks, algorithm=algorithm, check=check)
            result = reduced(
                group, _THROUGH, collective, self._sum(), op=op, root=root, counts=shares,
                algorithm=algorithm, check=check,
            )  # fmt: skip
            if result is None or (collective == "reduce" and group.rank != root):
                return None
            return deliver(result, out, result_shape)
        except BaseException as error:
            escaped(comm, collective, error)
            raise

    def _sum(self) -> Sum:
        levels = self._levels
        family = levels.family

        def words(agreed: np.ndarray, wire: Any) -> np.ndarray:
            picked = levels.words(agreed)
            return float64_sums(picked, agreed, family) if wire is np.float64 else picked

        def specials() -> np.ndarray:
            return np.zeros(levels.count, np.uint8) if levels.specials is None else levels.specials

        return Sum(family, self.dtype, levels.codes, levels.adds, words, specials)

    def __repr__(self) -> str:
        return f"ReproducibleSum({self.dtype} {self.shape}, {self.count} added)"
