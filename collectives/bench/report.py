"""The benchmark's table, nccl-tests style, and its JSON record."""

__all__ = [
    "Row",
    "Timing",
    "bandwidths",
    "format_footer",
    "format_header",
    "format_row",
    "to_json",
    "total_wrong",
]

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from collectives.algorithms import ALGORITHMS
from collectives.selector import AUTO

from .config import Settings

# (title, width) of the columns that name a row, then of each of its two halves; the
# algorithm column fits every "auto:<name>" the selector can choose
_ALGORITHM_WIDTH = max(10, *(len(f"{AUTO}:{name}") for name in ALGORITHMS))
_KEY_COLUMNS = (("size", 12), ("count", 12), ("type", 8), ("redop", 6), ("algorithm", _ALGORITHM_WIDTH))
_HALF_COLUMNS = (("time(us)", 10), ("algbw(GB/s)", 11), ("busbw(GB/s)", 11), ("#wrong", 6))
_SEPARATOR = " | "


@dataclass(frozen=True)
class Timing:
    """One half of a row: the run out of place, or the run in place.

    Attributes:
        time_us: the median over iterations of the slowest rank's time, in microseconds.
        algbw: size / time, in GB/s (1e9 bytes per second).
        busbw: algbw times the collective's bus-bandwidth factor.
        wrong: elements that differed from the expected result over all ranks;
            ``None`` when not checked.
    """

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None


@dataclass(frozen=True)
class Row:
    """One line of the table: a size measured with one algorithm.

    ``algorithm`` is the name asked for; for ``auto`` it is ``auto:<chosen>``.
    The barrier has no buffers, so it is timed once, as out of place, and
    its ``in_place`` is ``None``.
    """

    size: int
    count: int
    dtype: str
    op: str
    algorithm: str
    out_of_place: Timing
    in_place: Timing | None


def _timings(row: Row) -> list[Timing]:
    return [timing for timing in (row.out_of_place, row.in_place) if timing is not None]


def bandwidths(size: int, seconds: float, factor: float) -> tuple[float, float]:
    """``(algbw, busbw)`` in GB/s of moving ``size`` bytes in ``seconds``."""
    algbw = size / seconds / 1e9 if seconds > 0 else 0.0
    return algbw, algbw * factor


def _cells(values: list[str], columns: tuple[tuple[str, int], ...]) -> str:
    return " ".join(value.rjust(width) for value, (_, width) in zip(values, columns, strict=True))


def _width(columns: tuple[tuple[str, int], ...]) -> int:
    return sum(width for _, width in columns) + len(columns) - 1


def _time(us: float) -> str:
    # long times lose their decimals to stay in the column
    return f"{us:.2f}" if us < 1e6 else f"{us:.0f}"


def _half(timing: Timing | None) -> str:
    if timing is None:
        return _cells(["N/A"] * len(_HALF_COLUMNS), _HALF_COLUMNS)
    wrong = "N/A" if timing.wrong is None else str(timing.wrong)
    values = [_time(timing.time_us), f"{timing.algbw:.2f}", f"{timing.busbw:.2f}", wrong]
    return _cells(values, _HALF_COLUMNS)


def format_row(row: Row) -> str:
    """The table line of a row, aligned under :func:`format_header`'s columns."""
    key = _cells([str(row.size), str(row.count), row.dtype, row.op, row.algorithm], _KEY_COLUMNS)
    return " " + _SEPARATOR.join((key, _half(row.out_of_place), _half(row.in_place)))


def format_header(
    settings: Settings,
    world_size: int,
    library: str,
    notes: Mapping[str, str] | None = None,
    cost_model: str | None = None,
) -> list[str]:
    """The comment block and column titles that open the table.

    Args:
        settings: the run's options.
        world_size: the number of ranks.
        library: the first line of the MPI library's version.
        notes: why an algorithm that was asked for is left out, by name.
        cost_model: the selector's constants, when it chooses or explains.
    """
    lines = [
        f"# collectives {settings.collective} benchmark",
        "#",
        f"# MPI library : {library}",
        f"# world size  : {world_size}",
        f"# dtype       : {settings.dtype}",
        f"# op          : {settings.op or 'none'}",
        *([] if settings.root is None else [f"# root        : {settings.root}"]),
        f"# algorithms  : {', '.join(settings.algorithms) or 'none'}",
        f"# iterations  : {settings.iters} timed after {settings.warmup} warmup, check {int(settings.check)}",
    ]
    if cost_model is not None:
        lines.append(f"# cost model  : {cost_model}")
    lines += [f"# skipped     : {name}: {why}" for name, why in (notes or {}).items()]
    half = _width(_HALF_COLUMNS)
    groups = (" " * _width(_KEY_COLUMNS), "out-of-place".center(half), "in-place".center(half))
    halves = _cells([title for title, _ in _HALF_COLUMNS], _HALF_COLUMNS)
    titles = (_cells([title for title, _ in _KEY_COLUMNS], _KEY_COLUMNS), halves, halves)
    lines += ["#", "#" + _SEPARATOR.join(groups).rstrip(), "#" + _SEPARATOR.join(titles)]
    return lines


def _asked(row: Row) -> str:
    """The algorithm the row's run asked for: ``auto`` for ``auto:ring``."""
    return row.algorithm.partition(":")[0]


def _average_busbw(rows: list[Row]) -> float:
    values = [timing.busbw for row in rows for timing in _timings(row)]
    return sum(values) / len(values) if values else 0.0


def total_wrong(rows: list[Row]) -> int:
    """Wrong elements over every row and both halves; unchecked halves count none."""
    return sum(timing.wrong or 0 for row in rows for timing in _timings(row))


def format_footer(rows: list[Row]) -> list[str]:
    """The closing lines: the wrong elements in all, and the mean bus bandwidth.

    The mean is over both halves of every row, one line per algorithm asked for
    (``auto`` whatever it chose) when there are several.
    """
    wrong = total_wrong(rows)
    lines = [f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}"]
    algorithms = list(dict.fromkeys(_asked(row) for row in rows))
    if len(algorithms) <= 1:
        return [*lines, f"# Avg bus bandwidth    : {_average_busbw(rows):.4f}"]
    for algorithm in algorithms:
        mine = [row for row in rows if _asked(row) == algorithm]
        lines.append(f"# Avg bus bandwidth    : {_average_busbw(mine):.4f}  ({algorithm})")
    return lines


def to_json(settings: Settings, world_size: int, library: str, rows: list[Row]) -> dict[str, Any]:
    """The run as JSON-ready data: its metadata and every row."""
    return {
        "collective": settings.collective,
        "world_size": world_size,
        "mpi_library_version": library,
        "dtype": settings.dtype,
        "op": settings.op or "none",
        "root": settings.root,
        "algorithms": list(settings.algorithms),
        "iters": settings.iters,
        "warmup": settings.warmup,
        "check": settings.check,
        "rows": [asdict(row) for row in rows],
    }
