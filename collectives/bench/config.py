"""What a benchmark run measures: its settings and the message sizes it sweeps."""

__all__ = [
    "MPI_ALGORITHM",
    "Settings",
    "add_datatype",
    "add_sweep",
    "default_algorithm",
    "element_count",
    "parse_size",
    "plan_sizes",
    "size_argument",
    "size_sweep",
]

import argparse
import inspect
from dataclasses import dataclass

import collectives
from collectives.ops import DTYPES
from collectives.specs import get_spec

MPI_ALGORITHM = "mpi"
"""The pseudo-algorithm that runs the MPI library's own collective, for comparison."""

_UNITS = {"K": 1024, "M": 1024**2, "G": 1024**3}


@dataclass(frozen=True)
class Settings:
    """The options of one benchmark run.

    Attributes:
        collective: the collective's name, e.g. ``allreduce`` or ``broadcast``.
        sizes: the requested sizes in bytes of the full buffer, before rounding.
        dtype: the element type's name, e.g. ``float32``.
        op: the reduction's name; ``None`` for a collective that does not reduce.
        algorithms: the algorithms to compare, ``mpi`` meaning the MPI library's own and
            ``auto`` the selector's choice at each size.
        iters: timed iterations per measurement.
        warmup: untimed iterations before them.
        check: whether to count wrong elements after timing.
        explain: whether to print the selector's explanation at each size.
        root: the root of a rooted collective; ``None`` for the others.
    """

    collective: str
    sizes: tuple[int, ...]
    dtype: str
    op: str | None
    algorithms: tuple[str, ...]
    iters: int = 20
    warmup: int = 5
    check: bool = True
    explain: bool = False
    root: int | None = None


def default_algorithm(collective: str) -> str:
    """The algorithm the API uses when given none, so the benchmark times what users get."""
    default = inspect.signature(getattr(collectives, collective)).parameters["algorithm"].default
    return str(default)


def parse_size(text: str) -> int:
    """Bytes from ``8``, ``1K``, ``64M`` or ``2G`` (suffixes are powers of 1024).

    Raises:
        ValueError: the text is not a whole number with an optional K, M or G.
    """
    clean = text.strip().upper()
    scale = _UNITS.get(clean[-1:], 1)
    digits = clean[:-1] if clean[-1:] in _UNITS else clean
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(f"invalid size {text!r}; expected bytes such as 8, 1K, 64M or 2G")
    return int(digits) * scale


def size_argument(text: str) -> int:
    """:func:`parse_size` as an argparse ``type=``: a bad size is a usage error."""
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def add_sweep(
    parser: argparse.ArgumentParser, smallest: str, largest: str, factor: int = 4, what: str = "size"
) -> None:
    """A sweep's options: ``-b``/``--minbytes``, ``-e``/``--maxbytes`` and ``-f``/``--stepfactor``."""
    add, sized = parser.add_argument, size_argument
    add("-b", "--minbytes", type=sized, default=smallest, help=f"smallest {what} (default {smallest})")
    add("-e", "--maxbytes", type=sized, default=largest, help=f"largest {what} (default {largest})")
    add("-f", "--stepfactor", type=int, default=factor, help=f"size multiplier per step (default {factor})")


def add_datatype(parser: argparse.ArgumentParser, help: str = "default float32") -> None:
    """The ``-d``/``--datatype`` option: one of the library's dtypes, float32 by default."""
    parser.add_argument("-d", "--datatype", choices=DTYPES, default="float32", metavar="DTYPE", help=help)


def size_sweep(minbytes: int, maxbytes: int, factor: int) -> tuple[int, ...]:
    """The sizes ``minbytes``, ``minbytes * factor``, ... up to ``maxbytes``.

    Raises:
        ValueError: ``minbytes`` is below 1, ``maxbytes`` below it, or ``factor`` below 2.
    """
    if minbytes < 1 or maxbytes < minbytes:
        raise ValueError(f"need 1 <= minbytes <= maxbytes; got {minbytes} and {maxbytes}")
    if factor < 2:
        raise ValueError(f"the step factor must be at least 2; got {factor}")
    sizes = []
    size = minbytes
    while size <= maxbytes:
        sizes.append(size)
        size *= factor
    return tuple(sizes)


def element_count(collective: str, size: int, itemsize: int, world_size: int) -> int:
    """Elements of the full buffer of ``size`` bytes, rounded down so every rank's share is whole.

    Args:
        collective: the collective's name; shared collectives split the buffer over
            the ranks, and alltoall sends a share to each.
        size: bytes of the full buffer (allreduce's, broadcast's and reduce's buffer,
            reduce_scatter's and scatter's input, allgather's and gather's output,
            alltoall's input on each rank).
        itemsize: bytes of one element.
        world_size: the number of ranks.
    """
    per = world_size if get_spec(collective).shared or collective == "alltoall" else 1
    return size // (itemsize * per) * per


def plan_sizes(
    collective: str, sizes: tuple[int, ...], itemsize: int, world_size: int
) -> tuple[tuple[int, int], ...]:
    """The ``(bytes, elements)`` to measure: each size rounded down to whole shares.

    Sizes that round to no elements, or to a size already measured, are left out.
    The barrier moves no data: it has one row, of no bytes.
    """
    if not get_spec(collective).carries_data:
        return ((0, 0),)
    plan: list[tuple[int, int]] = []
    for size in sizes:
        count = element_count(collective, size, itemsize, world_size)
        if count and (count * itemsize, count) not in plan:
            plan.append((count * itemsize, count))
    return tuple(plan)
