"""``python -m bench simulate``: every algorithm and strategy's predicted time on a topology, without MPI.

Each row is a schedule placed on the topology's devices and timed by the cost
model (:func:`collectives.topology.cost_model.predict`): the time, its
bandwidth and latency terms, the link busy longest, and the back-of-the-
envelope figure the seeds would write for it, where they have one:

* aggregate on device d, which k others send to: 2 k S / B_d, B_d the
  bandwidth of d's one link (the seeds' 60 ms on a GPU and 80 ms on the CPU);
* split aggregation over P GPUs: 2 (P - 1) / P * S / B, B a GPU's one link
  (the seeds' 15 ms);
* packed rings: 2 S / (the rings' bandwidths together), the seeds' 6 ms on a
  DGX-1, which drops the ring's factor (P - 1) / P.
"""

__all__ = ["Row", "format_table", "main", "parse_bytes", "parse_topology", "rows"]

import argparse
import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical, multi_ring
from collectives.algorithms.base import implements
from collectives.errors import CollectivesError, TopologyError
from collectives.ops import DTYPES
from collectives.schedule import Schedule
from collectives.simulate import simulate
from collectives.specs import COLLECTIVES
from collectives.topology import Topology, pack_rings
from collectives.topology.cost_model import Prediction, predict
from collectives.topology.presets import PRESETS
from collectives.topology.rings import RingPacking
from collectives.topology.strategies import aggregate_on, split_aggregation

from .patterns import numpy_dtype

_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}


@dataclass(frozen=True)
class Row:
    """One line of the table.

    Attributes:
        label: the algorithm or strategy, in words.
        schedule: what runs.
        prediction: the cost model's prediction; ``None`` when the topology
            cannot carry the schedule.
        envelope_s: the seeds' back-of-the-envelope time; ``None`` where they have none.
        problem: why there is no prediction, e.g. two ranks without a route.
    """

    label: str
    schedule: Schedule
    prediction: Prediction | None
    envelope_s: float | None
    problem: str = ""


def parse_bytes(text: str) -> int:
    """Bytes from ``160MB`` (powers of 1000, as the seeds count), ``64MiB`` or ``64M`` (powers of 1024).

    Raises:
        ValueError: the text is not a whole number with one of those units.
    """
    match = re.fullmatch(r"\s*(\d+)\s*([KMG]?)(I?B)?\s*", text.upper())
    if match is None:
        raise ValueError(f"invalid size {text!r}; expected bytes such as 160MB, 64MiB or 64M")
    digits, prefix, unit = match.groups()
    binary = unit == "IB" or (unit is None and prefix != "")
    scale = 1024 ** " KMG".index(prefix or " ") if binary else _DECIMAL[prefix]
    return int(digits) * scale


def parse_topology(text: str) -> Topology:
    """A preset from ``dgx1``, ``pcie_switch:4``, ``multi_node:4,8,100`` or ``multi_node(4,8,100)``.

    Raises:
        ValueError: an unknown preset, or arguments it does not take.
    """
    match = re.fullmatch(r"\s*(\w+)\s*(?:[:(]([\d.,\s]*)\)?)?\s*", text)
    preset = PRESETS.get(match.group(1)) if match else None
    if match is None or preset is None:
        raise ValueError(f"unknown topology {text!r}; presets: {', '.join(PRESETS)}")
    args = [float(a) if "." in a else int(a) for a in (match.group(2) or "").replace(" ", "").split(",") if a]
    try:
        return preset(*args)
    except (TypeError, CollectivesError) as error:
        raise ValueError(f"topology {text!r}: {error}") from None


def rows(topology: Topology, collective: str, size: int, itemsize: int) -> list[Row]:
    """Every registered algorithm, then the topology's own strategies, predicted for ``size`` bytes.

    The algorithms run as built for the topology's GPU count, rank r on GPU r.
    The strategies use what the topology knows: its packed rings (one way and
    both ways), its nodes (hierarchical) and, for allreduce, the seeds'
    aggregation on one GPU, on the CPU, and split over the GPUs.
    """
    gpus = topology.gpus
    count = size // itemsize
    found: list[Row] = []

    def add(
        label: str, schedule: Schedule, placement: Sequence[str] = gpus, envelope: float | None = None
    ) -> None:
        simulate(schedule)  # only schedules that meet their contract are timed
        try:
            found.append(Row(label, schedule, predict(schedule, topology, itemsize, placement), envelope))
        except TopologyError as error:  # e.g. GPUs that do not forward, between two that talk
            found.append(Row(label, schedule, None, envelope, str(error)))

    for name, module in ALGORITHMS.items():
        if implements(module, collective):
            add(name, build_schedule(collective, name, len(gpus), count))
    packing = pack_rings(topology)
    if packing.rings:
        rings, weights = packing.rank_rings(gpus), packing.bandwidths
        for both in (False, True):
            label = "multi_ring on packed rings" + (", both ways" if both else "")
            envelope = 2 * size / packing.total if collective == "allreduce" and not both else None
            add(label, _multi_ring(collective, len(gpus), count, rings, weights, both), envelope=envelope)
    nodes = topology.nodes
    if collective == "allreduce" and len(nodes) > 1 and len({len(node) for node in nodes}) == 1:
        local = len(nodes[0])
        add(f"hierarchical, nodes of {local}", hierarchical.allreduce(len(gpus), count, local))
    if collective == "allreduce":
        cpus = [d.name for d in topology.devices if d.kind == "cpu"]
        for device in (gpus[0], *cpus[:1]):
            strategy = aggregate_on(topology, device, count)
            senders = len(strategy.placement) - 1
            add(
                strategy.name,
                strategy.schedule,
                strategy.placement,
                _envelope(topology, [device], 2 * senders * size),
            )
        split = split_aggregation(topology, count)
        p = len(gpus)
        add(split.name, split.schedule, split.placement, _envelope(topology, gpus, 2 * (p - 1) / p * size))
    return found


def _multi_ring(
    collective: str,
    world_size: int,
    count: int,
    rings: tuple[tuple[int, ...], ...],
    weights: tuple[float, ...],
    both: bool,
) -> Schedule:
    if collective == "allreduce":
        return multi_ring.allreduce(world_size, count, rings, weights, bidirectional=both)
    builder = multi_ring.reduce_scatter if collective == "reduce_scatter" else multi_ring.allgather
    shares = build_schedule(collective, "ring", world_size, count).chunk_sizes
    return builder(shares, rings, weights, bidirectional=both)


def _envelope(topology: Topology, devices: Sequence[str], size: float) -> float | None:
    """The seeds' reckoning: ``size`` bytes through each device's one link; ``None`` if one has more links.

    With one link, all a device receives must cross it, so the figure is the
    least time the bandwidth allows; with several it depends on the routes.
    """
    widths = []
    for device in devices:
        links = [link for link in topology.links if device in (link.a, link.b)]
        if len(links) != 1:
            return None
        widths.append(links[0].bandwidth)
    return size / min(widths)


def format_table(topology: Topology, collective: str, size: int, dtype: str, found: Sequence[Row]) -> str:
    """The report: a header naming the run, a row per schedule, and the fastest."""
    packing = pack_rings(topology)
    lines = [
        f"# collectives simulate: {collective} of {_bytes(size)} ({size // numpy_dtype(dtype).itemsize} x "
        f"{dtype}) on {topology.name}",
        f"#   {topology.description}",
        f"#   rings found: {_rings(packing)}",
        "#",
    ]
    links = [_busiest(topology, row.prediction) for row in found]
    label_width = max([len("algorithm / strategy"), *(len(row.label) for row in found)])
    link_width = max([len("busiest link"), *map(len, links)])
    lines.append(
        f"# {'algorithm / strategy':<{label_width}}  steps  {'time ms':>9}  {'bandw. ms':>9}  "
        f"{'lat. ms':>8}  {'busiest link':<{link_width}}  {'busy ms':>9}  {'envelope ms':>11}"
    )
    for row, link in zip(found, links, strict=True):
        p = row.prediction
        head = f"  {row.label:<{label_width}}  {len(row.schedule.steps):>5}  "
        if p is None:
            lines.append(f"{head}{'-':>9}  {row.problem}")
            continue
        envelope = "" if row.envelope_s is None else f"{row.envelope_s * 1e3:.3f}"
        lines.append(
            f"{head}{p.time_s * 1e3:>9.3f}  {p.bandwidth_s * 1e3:>9.3f}  {p.latency_s * 1e3:>8.3f}  "
            f"{link:<{link_width}}  {p.busiest_link_s * 1e3:>9.3f}  {envelope:>11}"
        )
    timed = [(row.prediction.time_s, row.label) for row in found if row.prediction is not None]
    if timed:
        time_s, label = min(timed, key=lambda pair: pair[0])
        lines.append(f"# fastest: {label} ({time_s * 1e3:.3f} ms)")
    lines.append(
        "# envelope: the seeds' figure, bandwidth alone: aggregation 2 k S / B_device, split "
        "2 (P-1)/P S / B_gpu (devices of one link), rings 2 S / B_rings"
    )
    return "\n".join(lines)


def _bytes(size: int) -> str:
    units = (("GB", 10**9), ("MB", 10**6), ("kB", 10**3), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    for unit, scale in units:
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} B"


def _rings(packing: RingPacking) -> str:
    if not packing.rings:
        return "none over direct links (the GPUs meet only through switches)"
    rings = packing.rank_rings()
    parts = [
        f"{'-'.join(map(str, ring))} at {width / 1e9:g} GB/s"
        for ring, width in zip(rings, packing.bandwidths, strict=True)
    ]
    return f"{'; '.join(parts)}: {packing.total / 1e9:g} of at most {packing.bound / 1e9:g} GB/s"


def _busiest(topology: Topology, prediction: Prediction | None) -> str:
    if prediction is None or prediction.busiest_link is None:
        return "-"
    return topology.describe(prediction.busiest_link)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench simulate",
        description="Predict each algorithm's time on a topology with the cost model; needs no MPI.",
    )
    add = parser.add_argument
    add(
        "-t",
        "--topology",
        default="dgx1",
        help=f"a preset, with arguments as in multi_node:4,8,100: {', '.join(PRESETS)} (default dgx1)",
    )
    add("-s", "--size", default="160MB", help="bytes of the buffer: 160MB, 64MiB, 64M (default 160MB)")
    add(
        "-c",
        "--collective",
        choices=COLLECTIVES,
        default="allreduce",
        help="the collective (default allreduce)",
    )
    add(
        "-d",
        "--datatype",
        choices=DTYPES,
        default="float32",
        metavar="DTYPE",
        help="element type (default float32)",
    )
    add(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw the topology and its rings (needs matplotlib)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    """Print the table; draw the topology when asked."""
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        topology = parse_topology(args.topology)
        size = parse_bytes(args.size)
    except ValueError as error:
        parser.error(str(error))
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        parser.error("--plot needs matplotlib: pip install 'collectives[plot]'")
    itemsize = numpy_dtype(args.datatype).itemsize
    if size < itemsize:
        parser.error(f"size {size} is less than one {args.datatype}")
    print(
        format_table(
            topology, args.collective, size, args.datatype, rows(topology, args.collective, size, itemsize)
        )
    )
    if args.plot is not None:
        from .plot import draw

        draw(topology, pack_rings(topology), args.plot)
        print(f"# drew {topology.name} and its rings in {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
