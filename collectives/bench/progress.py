"""Progress of long runs on stderr: a tqdm bar on a terminal, or a line per part with the time left.

Never in the tables (stdout), and not on ranks other than 0.
"""

__all__ = ["Countdown", "progress"]

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import TextIO, TypeVar

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


class Countdown:
    """The time left of a run of known parts, each weighed by its expected cost: a line on stderr per part.

    The estimate is the time so far scaled by the weight left over the weight done,
    so it firms up as parts are done; the first part's line gives the run's length.
    """

    def __init__(
        self, what: str, weights: Sequence[float], *, shown: bool = True, stream: TextIO | None = None
    ) -> None:
        self.what = what
        self.weights = list(weights)
        self.shown = shown
        self.stream = stream
        self.finished = 0
        self.started = time.perf_counter()

    def done(self) -> str:
        """Mark the next part done; the line it prints (where shown), e.g. ``3 of 36 rows after 4 s; ...``."""
        self.finished += 1
        elapsed = time.perf_counter() - self.started
        total, done = sum(self.weights), sum(self.weights[: self.finished])
        left = elapsed * (total - done) / done if done > 0 else 0.0
        line = f"{self.what}: {self.finished} of {len(self.weights)} rows after {_seconds(elapsed)}"
        line += f"; about {_seconds(left)} to go" if self.finished < len(self.weights) else ", done"
        if self.shown:
            print(line, file=self.stream or sys.stderr, flush=True)
        return line


def _seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:.0f} s"
