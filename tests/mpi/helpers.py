"""Helpers for the MPI tests: pass/fail combined over ranks, exact inputs, and mpi4py references."""

__all__ = [
    "DTYPE_OPS",
    "MPI_OPS",
    "Problems",
    "algorithms_for",
    "as_dtype",
    "assert_all",
    "closed_form",
    "count_calls",
    "counts_for",
    "exact_input",
    "gather_input",
    "mismatch",
    "mpi_reference",
    "uneven_counts",
]

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from typing import Any

import ml_dtypes  # noqa: F401 - registers bfloat16 with numpy
import numpy as np
import pytest
from mpi4py import MPI

from collectives.algorithms import ALGORITHMS
from collectives.ops import DTYPES, OPS
from collectives.specs import exact_pattern

MPI_OPS = {
    "sum": MPI.SUM,
    "prod": MPI.PROD,
    "min": MPI.MIN,
    "max": MPI.MAX,
    "avg": MPI.SUM,  # then divided by the world size
    "band": MPI.BAND,
    "bor": MPI.BOR,
    "bxor": MPI.BXOR,
}

DTYPE_OPS = [(dtype, op.name) for dtype in DTYPES for op in OPS.values() if dtype in op.dtypes]
"""Every (dtype, op) pair the library reduces."""

_MESSAGES_PER_RANK = 8


def assert_all(ok: bool, message: str, comm: MPI.Intracomm = MPI.COMM_WORLD) -> None:
    """Fail on every rank when ``ok`` is false on any, with each failing rank's message.

    Collective over ``comm``: one rank failing alone would leave the others
    waiting in the next collective, so the verdict is agreed first.

    Args:
        ok: this rank's verdict.
        message: what went wrong here; ignored where ``ok``.
        comm: the ranks that agree.
    """
    __tracebackhide__ = True
    if comm.allreduce(bool(ok), op=MPI.LAND):
        return
    messages = comm.allgather(None if ok else message)
    report = "\n".join(f"rank {rank}: {text}" for rank, text in enumerate(messages) if text is not None)
    pytest.fail(f"failed on {sum(m is not None for m in messages)} of {comm.size} ranks\n{report}")


class Problems:
    """What went wrong on this rank, checked on every rank at once by :meth:`check`.

    Exceptions raised inside :meth:`guard` are recorded rather than raised, so
    every rank goes on through the same collectives and reaches the verdict.
    """

    def __init__(self, comm: MPI.Intracomm = MPI.COMM_WORLD) -> None:
        self.comm = comm
        self.found: list[str] = []

    def expect_equal(self, label: str, actual: Any, expected: np.ndarray) -> None:
        """Record a problem unless ``actual`` has ``expected``'s dtype, shape and bits."""
        problem = mismatch(actual, expected)
        if problem is not None:
            self.found.append(f"{label}: {problem}")

    def expect(self, ok: bool, label: str) -> None:
        """Record ``label`` as a problem unless ``ok``."""
        if not ok:
            self.found.append(label)

    @contextmanager
    def guard(self, label: str) -> Iterator[None]:
        """Record an exception raised in the block as a problem, and carry on."""
        try:
            yield
        except Exception as error:
            self.found.append(f"{label}: raised {type(error).__name__}: {error}")

    def check(self) -> None:
        """Fail on every rank if any rank found a problem; collective."""
        __tracebackhide__ = True
        shown = self.found[:_MESSAGES_PER_RANK]
        if len(self.found) > len(shown):
            shown.append(f"... and {len(self.found) - len(shown)} more")
        assert_all(not self.found, "\n  ".join(["", *shown]), self.comm)


def mismatch(actual: Any, expected: np.ndarray) -> str | None:
    """What differs between ``actual`` and ``expected`` (dtype, shape or bits); None if nothing.

    Bits are compared through an unsigned view, so NaNs compare by payload and
    -0.0 differs from 0.0.
    """
    if not isinstance(actual, np.ndarray):
        return f"got a {type(actual).__name__}, expected an ndarray"
    if actual.dtype != expected.dtype:
        return f"dtype {actual.dtype}, expected {expected.dtype}"
    if actual.shape != expected.shape:
        return f"shape {actual.shape}, expected {expected.shape}"
    unsigned = np.dtype(f"u{expected.dtype.itemsize}")
    wrong = np.flatnonzero(actual.view(unsigned) != expected.view(unsigned))
    if wrong.size == 0:
        return None
    first = int(wrong[0])
    return (
        f"{wrong.size} of {expected.size} elements differ; first at flat index {first}: "
        f"{actual.reshape(-1)[first]!r}, expected {expected.reshape(-1)[first]!r}"
    )


def as_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of a dtype name the library uses (bfloat16 through ml_dtypes)."""
    return np.dtype(name)


def counts_for(world_size: int) -> list[int]:
    """Element counts to try: 0, 1, fewer than P, P, P + 1, not divisible by P, a few thousand."""
    return sorted({0, 1, max(world_size - 1, 0), world_size, world_size + 1, 2 * world_size + 1, 3001})


def uneven_counts(world_size: int) -> list[list[int]]:
    """Per-rank counts that differ between ranks, several with zeros."""
    p = world_size
    return [
        [r % 3 for r in range(p)],  # zero on rank 0 and every third rank
        [0] * (p - 1) + [5],  # all on the last rank
        [7] + [0] * (p - 1),  # all on the first rank
        [2 * r + 1 for r in range(p)],
        [0] * p,
    ]


def algorithms_for(collective: str) -> list[str]:
    """The names of the registered algorithms that implement ``collective``."""
    return [name for name, module in ALGORITHMS.items() if hasattr(module, collective)]


def exact_input(op: str, dtype: str, count: int, rank: int, world_size: int) -> np.ndarray:
    """Rank ``rank``'s input of ``count`` elements from ``exact_pattern(op, world_size)``."""
    values = np.asarray(exact_pattern(op, world_size).values)
    return values[(np.arange(count) + rank) % len(values)].astype(as_dtype(dtype))


def closed_form(op: str, dtype: str, count: int, world_size: int) -> np.ndarray:
    """The allreduce of :func:`exact_input` over ``world_size`` ranks, from the pattern alone."""
    combined = np.asarray(exact_pattern(op, world_size).combined)
    result = combined[np.arange(count) % len(combined)].astype(as_dtype(dtype))
    if op == "avg":
        result = np.true_divide(result, world_size, dtype=result.dtype)
    return result


def gather_input(dtype: str, shape: tuple[int, ...], rank: int) -> np.ndarray:
    """An input for the gathers whose values name the rank and element, small enough for int8."""
    count = int(np.prod(shape, dtype=np.int64))
    return ((np.arange(count) * 7 + rank * 31) % 101).astype(as_dtype(dtype)).reshape(shape)


@cache
def _mpi_reduces(dtype: str, op: str) -> bool:
    """Whether mpi4py over this MPI reduces ``dtype`` with ``op``.

    With MPICH through mpi4py 4, float16 has an MPI type and reduces; bfloat16
    has none (mpi4py raises BufferError), so its references go through float32.
    The probe runs on COMM_SELF, so it is local, and every rank answers alike.
    """
    probe = np.ones(1, as_dtype(dtype))
    try:
        MPI.COMM_SELF.Allreduce(probe, np.empty_like(probe), op=MPI_OPS[op])
    except Exception:
        return False
    return True


def mpi_reference(
    collective: str,
    x: np.ndarray,
    op: str,
    comm: MPI.Intracomm,
    counts: Sequence[int] | None = None,
    root: int = 0,
) -> np.ndarray:
    """What mpi4py's own collective gives for ``x``: the reference the library must equal bitwise.

    ``collective`` is ``allreduce`` (``comm.Allreduce``), ``reduce``
    (``comm.Reduce`` to ``root``; the result is significant only there) or
    ``reduce_scatter`` (``comm.Reduce_scatter_block``, or ``comm.Reduce_scatter``
    with ``counts``).
    ``avg`` is MPI's sum divided by the world size in the dtype. A dtype MPI
    cannot reduce (bfloat16) is reduced in float32 and cast back, exact for the
    integer-valued inputs the tests use.
    """
    dtype = x.dtype
    send = x.copy(order="C")  # np.ascontiguousarray would make a 0-d x 1-d
    if not _mpi_reduces(dtype.name, op):
        send = send.astype(np.float32)
    if collective == "allreduce":
        result = np.empty_like(send)
        comm.Allreduce(send, result, op=MPI_OPS[op])
    elif collective == "reduce":
        result = np.zeros_like(send)
        comm.Reduce(send, result, op=MPI_OPS[op], root=root)
    elif counts is None:
        rows = send.shape[0] // comm.size
        result = np.empty((rows, *send.shape[1:]), send.dtype)
        comm.Reduce_scatter_block(send, result, op=MPI_OPS[op])
    else:
        result = np.empty(counts[comm.rank], send.dtype)
        comm.Reduce_scatter(send.reshape(-1), result, list(counts), op=MPI_OPS[op])
    result = result.astype(dtype)
    if op == "avg":
        result = np.true_divide(result, comm.size, dtype=dtype)
    return result


def count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> list[int]:
    """Count the calls of ``owner.name`` from now on (the test's monkeypatch undoes it): ``[calls]``."""
    calls = [0]
    original = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, counted)
    return calls
