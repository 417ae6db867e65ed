"""``bench simulate``: every algorithm and strategy's predicted time on a topology, without MPI.

Each row is a schedule placed on the topology's devices and timed by the cost
model (:func:`collectives.topology.link_model.predict_fast`, the same
prediction as ``predict``, found faster between nodes): the time, its
bandwidth and latency terms, the link busy longest, and the back-of-the-
envelope figure the seeds would write for it, where they have one:

* aggregate on device d, which k others send to: 2 k S / B_d, B_d the
  bandwidth of d's one link (the seeds' 60 ms on a GPU and 80 ms on the CPU);
* split aggregation over P GPUs: 2 (P - 1) / P * S / B, B a GPU's one link
  (the seeds' 15 ms);
* packed rings: 2 S / (the rings' bandwidths together), the seeds' 6 ms on a
  DGX-1, which drops the ring's factor (P - 1) / P.

``--sweep-ranks P`` prints instead each algorithm's time on 2, 4, ... P ranks
(:func:`sweep`), and ``--plot`` then draws that scaling curve.
"""

__all__ = [
    "CHECK_RANKS",
    "SchedulePrediction",
    "format_table",
    "main",
    "parse_bytes",
    "parse_topology",
    "rows",
    "sweep",
]

import argparse
import importlib.util
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from collectives.algorithms import ALGORITHMS, build_schedule, hierarchical, multi_ring
from collectives.algorithms.base import implements
from collectives.errors import CollectivesError, TopologyError
from collectives.prediction import predict_algorithm
from collectives.schedule import Schedule
from collectives.simulate import simulate
from collectives.specs import COLLECTIVES
from collectives.topology import Topology, multi_node, pack_rings
from collectives.topology.link_model import Prediction, predict_fast
from collectives.topology.presets import PRESETS
from collectives.topology.programs import ALL_RANKS_BUDGET, predict_programs
from collectives.topology.rings import RingPacking
from collectives.topology.strategies import aggregate_on, split_aggregation, split_star_program

from .config import add_datatype
from .patterns import numpy_dtype
from .progress import progress
from .sweep import Sweep, format_sweep
from .table import Column, Table

_DECIMAL = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9}

CHECK_RANKS = 64
"""The most ranks whose schedules are checked against their contract before they are timed.

The symbolic check follows every rank's contributions through every step, minutes
at 512 ranks; the tests check every algorithm at the world sizes they use, and
past this size the table trusts them.
"""

_FITTED = "hierarchical (nodes)"  # the sweep's line for the hierarchical allreduce fitted to the machines


@dataclass(frozen=True)
class SchedulePrediction:
    """One line of the table.

    Attributes:
        label: the algorithm or strategy, in words.
        schedule: the name of what runs.
        steps: its steps.
        prediction: the cost model's prediction; ``None`` when the topology
            cannot carry the schedule.
        envelope_s: the seeds' back-of-the-envelope time; ``None`` where they have none.
        problem: why there is no prediction, e.g. two ranks without a route.
    """

    label: str
    schedule: str
    steps: int
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


def rows(
    topology: Topology,
    collective: str,
    size: int,
    itemsize: int,
    *,
    check: bool | None = None,
    budget: int = ALL_RANKS_BUDGET,
) -> list[SchedulePrediction]:
    """Every registered algorithm, then the topology's own strategies, predicted for ``size`` bytes.

    The algorithms run as built for the topology's GPU count, rank r on GPU r.
    The strategies use what the topology knows: its packed rings (one way and
    both ways), its nodes (hierarchical) and, for allreduce, the seeds'
    aggregation on one GPU, on the CPU, and split over the GPUs. Each schedule
    is checked against its contract first (``check``; by default up to
    :data:`CHECK_RANKS` ranks) and timed by
    :func:`~collectives.topology.link_model.predict_fast`, which equals ``predict``,
    or past :data:`CHECK_RANKS` ranks by :func:`collectives.prediction.predict_algorithm`
    (from the ranks' programs where the schedule is large).
    """
    gpus = topology.gpus
    count = size // itemsize
    found: list[SchedulePrediction] = []
    checking = len(gpus) <= CHECK_RANKS if check is None else check

    def add(
        label: str, schedule: Schedule, placement: Sequence[str] = gpus, envelope: float | None = None
    ) -> None:
        if checking:
            simulate(schedule)  # only schedules that meet their contract are timed
        name = schedule.name
        try:
            found.append(
                SchedulePrediction(
                    label,
                    name,
                    len(schedule.steps),
                    predict_fast(schedule, topology, itemsize, placement),
                    envelope,
                )
            )
        except TopologyError as error:  # e.g. GPUs that do not forward, between two that talk
            found.append(SchedulePrediction(label, name, len(schedule.steps), None, envelope, str(error)))

    def add_algorithm(label: str, name: str, fitted: bool = False) -> None:
        if checking:
            simulate(build_schedule(collective, name, len(gpus), count))
        try:
            prediction = predict_algorithm(
                collective, name, count, itemsize, topology, fitted=fitted, budget=budget
            )
        except (TopologyError, ValueError) as error:  # ValueError: too large a program to build
            found.append(SchedulePrediction(label, name, 0, None, None, str(error)))
            return
        steps = len(prediction.per_step)
        found.append(SchedulePrediction(label, prediction.schedule, steps, prediction, None))

    for name, module in ALGORITHMS.items():
        if implements(module, collective):
            add_algorithm(name, name)
    packing = pack_rings(topology)
    if packing.rings:
        rings, weights = packing.rank_rings(gpus), packing.bandwidths
        for both in (False, True):
            label = "multi_ring on packed rings" + (", both ways" if both else "")
            envelope = 2 * size / packing.total if collective == "allreduce" and not both else None
            add(label, _multi_ring(collective, len(gpus), count, rings, weights, both), envelope=envelope)
    nodes = topology.nodes
    if collective == "allreduce" and len(nodes) > 1 and len({len(node) for node in nodes}) == 1:
        label = f"hierarchical, nodes of {len(nodes[0])}"
        if checking:
            simulate(hierarchical.allreduce(len(gpus), count, len(nodes[0])))
        add_algorithm(label, "hierarchical", fitted=True)
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
        p = len(gpus)
        envelope = _envelope(topology, gpus, 2 * (p - 1) / p * size)
        if p <= CHECK_RANKS:
            split = split_aggregation(topology, count)
            add(split.name, split.schedule, split.placement, envelope)
        else:  # p squared transfers: predicted from the ranks' own parts
            split_prediction = predict_programs(
                lambda rank: split_star_program(p, count, rank), p, topology, itemsize, budget=budget
            )
            found.append(
                SchedulePrediction(
                    "split aggregation over the GPUs",
                    split_prediction.schedule,
                    2,
                    split_prediction,
                    envelope,
                )
            )
    return found


def sweep(
    collective: str,
    size: int,
    itemsize: int,
    *,
    gpus_per_node: int,
    nic_gbps: float,
    max_ranks: int,
    budget: int = ALL_RANKS_BUDGET,
) -> Sweep:
    """Predict every registered algorithm on ``multi_node`` machines of 2, 4, ... ``max_ranks`` ranks.

    P ranks below ``gpus_per_node`` are one node of P GPUs, otherwise P /
    ``gpus_per_node`` nodes (a world size the nodes do not divide is left out).
    Each point is :func:`collectives.prediction.predict_algorithm`: the global
    schedule while it is small, the ranks' programs past that, a sample of
    machines past ``budget`` (see :func:`collectives.topology.programs.predict_programs`).
    Where the machines are several, a line ``hierarchical (nodes)`` adds the
    hierarchical allreduce fitted to them.
    """
    count = size // itemsize
    ranks = tuple(
        p
        for p in (2**k for k in range(1, max(max_ranks, 2).bit_length()))
        if p <= max_ranks and (p < gpus_per_node or p % gpus_per_node == 0)
    )
    names = [name for name, module in ALGORITHMS.items() if implements(module, collective)]
    fitted = collective == "allreduce" and ranks and ranks[-1] > gpus_per_node
    times: dict[str, list[float | None]] = {name: [] for name in names}
    if fitted:
        times[_FITTED] = []
    stopped: dict[str, str] = {}
    for p in progress(ranks, len(ranks), "world sizes"):
        topology = multi_node(max(p // gpus_per_node, 1), min(p, gpus_per_node), nic_gbps)
        # alltoall takes whole rows per rank
        total = count - count % p if collective == "alltoall" else count
        for name in [*names, *([_FITTED] if fitted else [])]:
            if name == _FITTED and p <= gpus_per_node:
                times[name].append(None)
                continue
            algorithm = "hierarchical" if name == _FITTED else name
            try:
                prediction = predict_algorithm(
                    collective, algorithm, total, itemsize, topology, fitted=name == _FITTED, budget=budget
                )
            except (CollectivesError, ValueError) as error:
                stopped.setdefault(name, f"none at {p} ranks: {error}")
                times[name].append(None)
                continue
            times[name].append(prediction.time_s)
    name = f"multi_node(P/{gpus_per_node}, {gpus_per_node}, {nic_gbps:g})"
    return Sweep(name, ranks, {k: tuple(v) for k, v in times.items()}, stopped)


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


def format_table(
    topology: Topology, collective: str, size: int, dtype: str, found: Sequence[SchedulePrediction]
) -> str:
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
    table = Table(
        [Column("algorithm / strategy", left=True), Column("steps"), Column("time ms", ".3f"),
         Column("bandw. ms", ".3f"), Column("lat. ms", ".3f"), Column("busiest link", left=True),
         Column("busy ms", ".3f"), Column("envelope ms", ".3f")]
    )  # fmt: skip
    cells: list[list[object]] = []
    for row, link in zip(found, links, strict=True):
        p = row.prediction
        if p is None:
            cells.append([row.label, row.steps, *[None] * 6])
            continue
        envelope = None if row.envelope_s is None else row.envelope_s * 1e3
        times = (p.time_s, p.bandwidth_s, p.latency_s)
        cells.append(
            [row.label, row.steps, *(t * 1e3 for t in times), link, p.busiest_link_s * 1e3, envelope]
        )
    header, *table_rows = table.lines(cells)
    lines.append(header)
    # a schedule with no prediction says why at the end of its row
    lines += [
        line if row.prediction else f"{line}  {row.problem}"
        for line, row in zip(table_rows, found, strict=True)
    ]
    sampled = [row for row in found if row.prediction is not None and row.prediction.sampled_nodes]
    if sampled:
        machines = sampled[0].prediction.sampled_nodes if sampled[0].prediction else ()
        lines.append(
            f"# from machines {', '.join(map(str, machines or ()))}'s ranks' programs, standing for all "
            f"(alike machines): {', '.join(row.label for row in sampled)}"
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
        prog="python -m collectives bench simulate",
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
    add_datatype(parser, "element type (default float32)")
    add(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw the topology and its rings, or the scaling curve of --sweep-ranks (needs matplotlib)",
    )
    add(
        "--sweep-ranks",
        type=int,
        metavar="P",
        help="instead of the table, each algorithm's time on 2, 4, ... P ranks, on nodes of the "
        "multi_node topology's shape",
    )
    add(
        "--parameter-servers",
        action="store_true",
        help="instead of the table, a parameter server's push and pull on 1, 2, 4, ... machines of the "
        "multi_node topology's shape (up to its machines): one central server, --servers sharded ones, "
        "colocated ones, and allreduce for comparison",
    )
    add(
        "--servers",
        type=int,
        default=8,
        metavar="N",
        help="sharded servers for --parameter-servers (default 8)",
    )
    add(
        "--budget",
        type=int,
        default=ALL_RANKS_BUDGET,
        metavar="N",
        help="for large schedules, follow every machine's ranks while their programs hold at most N sends "
        f"and receives, else the first, middle and last machines' (default {ALL_RANKS_BUDGET:,}; 0: always)",
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
        parser.error("--plot needs matplotlib: pip install 'collectives-mpi[plot]'")
    itemsize = numpy_dtype(args.datatype).itemsize
    if size < itemsize:
        parser.error(f"size {size} is less than one {args.datatype}")
    if args.sweep_ranks is not None or args.parameter_servers:
        return _sweep(parser, args, topology, size, itemsize)
    print(
        format_table(
            topology,
            args.collective,
            size,
            args.datatype,
            rows(topology, args.collective, size, itemsize, budget=args.budget),
        )
    )
    if args.plot is not None:
        from .plot import draw

        draw(topology, pack_rings(topology), args.plot)
        print(f"# drew {topology.name} and its rings in {args.plot}")
    return 0


def _sweep(
    parser: argparse.ArgumentParser, args: argparse.Namespace, topology: Topology, size: int, itemsize: int
) -> int:
    network = [link for link in topology.links if link.kind == "network"]
    if not network or (args.sweep_ranks is not None and args.sweep_ranks < 2):
        parser.error(
            "--sweep-ranks and --parameter-servers need a multi_node topology (and at least 2 ranks)"
        )
    shape: dict[str, Any] = {
        "gpus_per_node": len(topology.nodes[0]),
        "nic_gbps": network[0].bandwidth * 8 / 1e9,
    }
    if args.parameter_servers:
        from .parameter_servers import parameter_server_sweep

        if args.servers < 1:
            parser.error(f"--servers must be at least 1, got {args.servers}")
        found = parameter_server_sweep(
            size, itemsize, **shape, max_machines=len(topology.nodes), servers=args.servers
        )
        what = f"a push and pull of {_bytes(size)} per GPU"
    else:
        found = sweep(
            args.collective, size, itemsize, **shape, max_ranks=args.sweep_ranks, budget=args.budget
        )
        what = f"{args.collective} of {_bytes(size)}"
    print(format_sweep(found, what, args.datatype))
    if args.plot is not None:
        from .plot import draw_sweep

        draw_sweep(found, what, args.plot)
        print(f"# drew the scaling curve in {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
