"""Drawing a topology and its rings, or a scaling curve, with matplotlib (the ``plot`` extra), when asked."""

__all__ = ["draw", "draw_sweep", "layout"]

import math
from pathlib import Path
from typing import TYPE_CHECKING

from collectives.topology import Topology
from collectives.topology.rings import RingPacking

if TYPE_CHECKING:
    from .sweep import Sweep

_RING_COLOURS = ("tab:red", "tab:blue", "tab:green", "tab:orange", "tab:purple", "tab:brown")
_KIND_COLOURS = {"gpu": "#76b900", "cpu": "#4a90d9", "switch": "#b0b0b0", "nic": "#e0a030"}


def layout(topology: Topology, packing: RingPacking) -> dict[str, tuple[float, float]]:
    """Where each device goes: GPUs on a circle, in the first ring's order when there is one.

    Every other device, nearest the GPUs first, goes inside the circle towards
    the devices it links to that are placed already, moved aside where that
    spot is taken.
    """
    order = packing.rings[0] if packing.rings else topology.gpus
    n = max(len(order), 1)
    spot = {
        name: (math.sin(2 * math.pi * i / n), math.cos(2 * math.pi * i / n)) for i, name in enumerate(order)
    }
    waiting = [d.name for d in topology.devices if d.name not in spot]
    while waiting:
        # the device with the most placed neighbours next, so switches settle by their GPUs
        name = max(waiting, key=lambda d: sum(e in spot for e in topology.neighbours(d)))
        waiting.remove(name)
        near = [spot[e] for e in topology.neighbours(name) if e in spot] or [(0.0, 0.0)]
        x = 0.7 * sum(p[0] for p in near) / len(near)
        y = 0.7 * sum(p[1] for p in near) / len(near)
        norm = math.hypot(x, y)
        across = (-y / norm, x / norm) if norm > 1e-6 else (1.0, 0.0)
        for k in range(4 * len(spot) + 1):  # 0, then +1, -1, +2, -2, ... steps across
            shift = 0.18 * ((k + 1) // 2) * (1 if k % 2 else -1)
            here = (x + shift * across[0], y + shift * across[1])
            if all(math.hypot(here[0] - a, here[1] - b) > 0.16 for a, b in spot.values()):
                break
        spot[name] = here
    return spot


def draw(topology: Topology, packing: RingPacking, path: Path) -> None:
    """Draw ``topology``'s devices and links, and ``packing``'s rings as coloured arrows, into ``path``."""
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    spot = layout(topology, packing)
    figure = Figure(figsize=(9, 9))
    ax = figure.add_subplot()
    ax.set_aspect("equal")
    ax.axis("off")
    for link in topology.links:
        (x0, y0), (x1, y1) = spot[link.a], spot[link.b]
        ax.plot(
            [x0, x1],
            [y0, y1],
            color="#999999",
            linewidth=1.0 + 1.5 * min(link.lanes, 3),
            alpha=0.45,
            zorder=1,
        )
    handles = []
    for i, (ring, width) in enumerate(zip(packing.rings, packing.bandwidths, strict=True)):
        colour = _RING_COLOURS[i % len(_RING_COLOURS)]
        offset = 0.025 * (i + 1)
        for a, b in zip(ring, (*ring[1:], ring[0]), strict=True):
            (x0, y0), (x1, y1) = spot[a], spot[b]
            length = math.hypot(x1 - x0, y1 - y0) or 1.0
            dx, dy = -(y1 - y0) / length * offset, (x1 - x0) / length * offset
            ax.annotate(
                "",
                xy=(x1 + dx, y1 + dy),
                xytext=(x0 + dx, y0 + dy),
                arrowprops={
                    "arrowstyle": "-|>",
                    "color": colour,
                    "linewidth": 1.8,
                    "shrinkA": 14,
                    "shrinkB": 14,
                },
                zorder=2,
            )
        label = f"ring {i + 1}: {'-'.join(d.removeprefix('gpu') for d in ring)}, {width / 1e9:g} GB/s"
        handles.append(Line2D([], [], color=colour, linewidth=2, label=label))
    for device in topology.devices:
        x, y = spot[device.name]
        ax.scatter([x], [y], s=900, color=_KIND_COLOURS[device.kind], edgecolors="black", zorder=3)
        ax.text(x, y, device.name, ha="center", va="center", fontsize=7, zorder=4)
    if handles:
        ax.legend(handles=handles, loc="lower center", bbox_to_anchor=(0.5, -0.08), fontsize=9, frameon=False)
    ax.set_title(f"{topology.name}\n{topology.description}", fontsize=10)
    figure.savefig(path, dpi=110, bbox_inches="tight")


def draw_sweep(found: "Sweep", what: str, path: Path) -> None:
    """Draw ``found``: predicted time against ranks, one line per algorithm, both axes logarithmic."""
    from matplotlib.figure import Figure

    figure = Figure(figsize=(9, 6))
    ax = figure.add_subplot()
    for index, (name, times) in enumerate(found.times.items()):
        points = [(p, t * 1e3) for p, t in zip(found.ranks, times, strict=True) if t is not None and t > 0]
        if points:
            # the colour cycle has 10 colours: the lines after them are dashed
            style = "-" if index < 10 else "--"
            ax.plot(*zip(*points, strict=True), style, marker="o", markersize=3, label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel(found.axis)
    ax.set_ylabel("predicted time (ms)")
    ax.set_title(f"{what} on {found.topology}", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    figure.savefig(path, dpi=110, bbox_inches="tight")
