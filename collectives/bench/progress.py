"""Progress of long runs on the terminal: a tqdm bar on stderr, only where stderr is a terminal.

Never in the tables (stdout), never in a log or a pipe, and not on ranks other than 0.
"""

__all__ = ["progress"]

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], total: int | None = None, what: str = "", shown: bool = True) -> Iterator[T]:
    """``items``, with a bar on stderr as they are worked through where it is a terminal and tqdm is here."""
    if not shown or not sys.stderr.isatty():
        yield from items
        return
    try:
        from tqdm import tqdm  # type: ignore[import-untyped,unused-ignore]
    except ImportError:  # tqdm comes with the test extra; without it, no bar
        yield from items
        return
    yield from tqdm(items, total=total, desc=what, file=sys.stderr, leave=False, dynamic_ncols=True)
