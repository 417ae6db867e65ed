"""The one table printer of the benches, in nccl-tests' layout: a ``#`` title line, then the rows."""

__all__ = ["Column", "Table", "human_bytes"]

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

_GAP = "  "


@dataclass(frozen=True)
class Column:
    """One column of a :class:`Table`.

    Attributes:
        title: the heading; the column is at least this wide.
        spec: the format spec numbers are written with (``".2f"``); text is written as it is.
        width: the least width, for tables printed a row at a time (their widths cannot
            grow to fit later rows).
        left: whether values align left (names); numbers align right.
    """

    title: str
    spec: str = ""
    width: int = 0
    left: bool = False


class Table:
    """Columns and their widths; :meth:`lines` fits them to the rows, :meth:`row` writes one as it comes.

    A missing value (``None``) is written ``-``.
    """

    def __init__(self, columns: Sequence[Column]) -> None:
        self.columns = tuple(columns)
        self.widths = [max(c.width, len(c.title)) for c in self.columns]

    def header(self) -> str:
        """The title line."""
        return "# " + self._join([c.title for c in self.columns])

    def row(self, *values: object) -> str:
        """One row, in the widths so far (the values of a row printed at once may overflow them)."""
        if len(values) != len(self.columns):
            raise ValueError(f"a row of {len(values)} values for {len(self.columns)} columns")
        return "  " + self._join([self._text(v, c) for v, c in zip(values, self.columns, strict=True)])

    def lines(self, rows: Iterable[Sequence[object]]) -> list[str]:
        """The title line and every row, the widths grown to fit the widest value of each column."""
        rows = list(rows)
        for row in rows:
            for i, (value, column) in enumerate(zip(row, self.columns, strict=True)):
                self.widths[i] = max(self.widths[i], len(self._text(value, column)))
        return [self.header(), *(self.row(*row) for row in rows)]

    def _join(self, cells: Sequence[str]) -> str:
        return _GAP.join(
            cell.ljust(width) if column.left else cell.rjust(width)
            for cell, width, column in zip(cells, self.widths, self.columns, strict=True)
        ).rstrip()

    @staticmethod
    def _text(value: object, column: Column) -> str:
        if value is None:
            return "-"
        if isinstance(value, str):
            return value
        return format(value, column.spec)


def human_bytes(size: int) -> str:
    """``size`` bytes as nccl-tests' options write them: ``4K``, ``16M``, ``1G``; else the number."""
    for unit, scale in (("G", 1024**3), ("M", 1024**2), ("K", 1024)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)
