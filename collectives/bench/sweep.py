"""Predicted times against the number of ranks, and their table; shared by the simulator's benches."""

__all__ = ["Sweep", "format_sweep"]

from dataclasses import dataclass

from .table import Column, Table


@dataclass(frozen=True)
class Sweep:
    """Each algorithm's predicted time against the number of ranks, on nodes of one shape.

    Attributes:
        topology: the nodes' shape in words, e.g. ``multi_node(P/8, 8, 100)``.
        ranks: the world sizes, 2, 4, 8, ... (or what ``axis`` names).
        times: per algorithm, the predicted seconds at each world size; ``None``
            where it has none (see ``stopped``).
        stopped: per algorithm without a prediction at some size, why.
        axis: what ``ranks`` counts, in words (``machines`` for the parameter servers').
    """

    topology: str
    ranks: tuple[int, ...]
    times: dict[str, tuple[float | None, ...]]
    stopped: dict[str, str]
    axis: str = "ranks"


def format_sweep(found: Sweep, what: str, dtype: str) -> str:
    """The sweep as a table: a row per world size (or machines), a column of milliseconds per line."""
    names = list(found.times)
    table = Table([Column(found.axis, width=8), *(Column(name, ".3f", width=9) for name in names)])
    rows = [
        [p, *(None if (t := found.times[n][i]) is None else t * 1e3 for n in names)]
        for i, p in enumerate(found.ranks)
    ]
    lines = [
        f"# collectives simulate: {what} ({dtype}) on {found.topology}, predicted ms against {found.axis}",
        *table.lines(rows),
    ]
    lines += [f"# {name}: {why}" for name, why in found.stopped.items()]
    return "\n".join(lines)
