"""The arithmetic, table, JSON and plot of ``python -m collectives bench compare``, without MPI."""

__all__ = ["Ratio", "SizeResult", "format_table", "machine", "plot", "ratio", "to_json"]

import os
import platform
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .table import Column, Table, human_bytes


@dataclass(frozen=True)
class Ratio:
    """How one contender's times compare with a peer's, over rounds run side by side.

    Attributes:
        median: the median of ours over the median of the peer's times.
        q25: the lower quartile of the per-round ratios (ours / peer in the same round).
        q75: their upper quartile.
        low: the smallest per-round ratio.
        high: the largest per-round ratio.
    """

    median: float
    q25: float
    q75: float
    low: float
    high: float


def _quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) == 1:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def ratio(ours: Sequence[float], peer: Sequence[float]) -> Ratio:
    """Compare times of ours and a peer measured in the same rounds (``ours[i]`` beside ``peer[i]``).

    Raises:
        ValueError: the sequences are empty, of different lengths, or hold a time that is not positive.
    """
    if not ours or len(ours) != len(peer):
        raise ValueError(f"need equally many times, at least one; got {len(ours)} and {len(peer)}")
    if min(*ours, *peer) <= 0:
        raise ValueError("times must be positive")
    rounds = [a / b for a, b in zip(ours, peer, strict=True)]
    q25, q75 = _quartiles(rounds)
    return Ratio(statistics.median(ours) / statistics.median(peer), q25, q75, min(rounds), max(rounds))


@dataclass(frozen=True)
class SizeResult:
    """Every contender at one size.

    Attributes:
        size: bytes of the buffer.
        count: its elements.
        times_us: each contender's median time in microseconds (the slowest rank's per round).
        busbw: each contender's bus bandwidth in GB/s at that median.
        chosen: for ``auto``, the algorithm the selector chose.
        ratios: per (ours, peer), e.g. ``("auto", "mpi")``, the comparison of their times.
        wrong: per contender, elements that came out wrong on a checked call, over all ranks.
        floor: how the floor peer reduced at this size (see :mod:`bench.floor`), if it ran.
    """

    size: int
    count: int
    times_us: Mapping[str, float]
    busbw: Mapping[str, float]
    chosen: str | None
    ratios: Mapping[tuple[str, str], Ratio]
    wrong: Mapping[str, int]
    floor: str | None = None


def format_table(results: Sequence[SizeResult], ours: Sequence[str], peers: Sequence[str]) -> list[str]:
    """One line per size and contender of ours: its time and its ratio to each peer with the IQR."""
    columns = [Column("size", left=True), Column("algorithm", left=True)]
    columns += [Column("time(us)", ".1f"), Column("busbw(GB/s)", ".2f")]
    for peer in peers:
        columns += [
            Column(f"{peer}(us)", ".1f"),
            Column(f"ours/{peer}", ".2f"),
            Column("IQR"),
            Column("min-max"),
        ]
    rows: list[list[object]] = []
    for result in results:
        for name in ours:
            label = f"auto:{result.chosen}" if name == "auto" and result.chosen else name
            wrong = result.wrong.get(name, 0)
            row: list[object] = [human_bytes(result.size), label + (f" ({wrong} WRONG)" if wrong else "")]
            row += [result.times_us[name], result.busbw[name]]
            for peer in peers:
                r = result.ratios.get((name, peer))
                if r is None:
                    row += [None] * 4
                    continue
                row += [
                    result.times_us[peer],
                    r.median,
                    f"{r.q25:.2f}-{r.q75:.2f}",
                    f"{r.low:.2f}-{r.high:.2f}",
                ]
            rows.append(row)
    return Table(columns).lines(rows)


def machine() -> str:
    """This machine in a few words for a record: its processor, cores and system."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as info:
            names = [line.split(":", 1)[1].strip() for line in info if line.startswith("model name")]
        model = names[0] if names else model
    except OSError:
        pass
    return f"{model}, {os.cpu_count()} cores, {platform.system()} {platform.machine()}"


def to_json(results: Sequence[SizeResult], metadata: Mapping[str, Any]) -> dict[str, Any]:
    """The run as JSON-ready data: its metadata and, per size, every median and ratio."""
    sizes = []
    for result in results:
        record = asdict(result)
        record["ratios"] = [{"ours": a, "peer": b, **asdict(r)} for (a, b), r in result.ratios.items()]
        sizes.append(record)
    return {**metadata, "sizes": sizes}


def plot(results: Sequence[SizeResult], contenders: Sequence[str], title: str, path: Path) -> None:
    """Bus bandwidth against size for every contender, both axes logarithmic, saved to ``path``."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 5.5))
    ax = figure.add_subplot()
    for name in contenders:
        points = [(r.size, r.busbw[name]) for r in results if r.busbw.get(name, 0) > 0]
        if points:
            style = "-" if name in ("auto", "mpi", "gloo") else ":"
            ax.plot(*zip(*points, strict=True), style, marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
