"""The link model from ranks' own programs, without the global schedule: every machine's, or a sample's.

:func:`~collectives.topology.link_model.predict` routes every transfer of a
global schedule, and a ring's at 4,096 ranks holds 33 million of them. On a
topology whose machines meet only at one network switch (the hub,
:func:`~collectives.topology.presets.multi_node`), every link has an end on one
machine, and only transfers sent or received by that machine's ranks cross it:
a machine's links are loaded by its ranks' programs alone. So the steps of the
prediction can be summed from the programs of the ranks of some machines:

* **every machine** (exact): each link is loaded as ``predict`` loads it and the
  prediction is the same, step by step (up to the order of summing latencies);
  this is the choice while all the programs hold at most
  :data:`ALL_RANKS_BUDGET` sends and receives together, and on any topology
  without a hub;
* **a sample of machines** (the first, holding rank 0, the root of rooted
  collectives, the middle one, and the last, its neighbour where ranks wrap around): each step is
  timed by the busiest link of those machines and the longest route their
  ranks use. Where the machines are alike, as they are for the ring,
  halving-doubling, multi-ring, hierarchical and shared-memory schedules on
  machines of equal size, this is the exact figure (chunks an element apart
  aside); where one machine works harder (a tree's root), it may be less.
  So the sample checks itself: where the machines followed are not alike (each
  one's busiest link and longest route, summed over the steps, more than 1%
  apart), every machine is followed instead. The prediction says which machines it followed
  (``sampled_nodes``).

A rank's program (:class:`~collectives.schedule.RankProgram`) costs time and
memory proportional to its own transfers, so a sample of 24 ranks' programs at
4,096 ranks costs what 24 ranks do, not the 33 million transfers.
"""

__all__ = ["ALL_RANKS_BUDGET", "predict_programs", "program_traffic"]

import sys
from collections.abc import Callable, Iterable, Sequence

from ..errors import TopologyError
from ..schedule import RankProgram
from .cost_model import Traffic
from .graph import LinkId, Topology
from .link_model import HubRoutes, Prediction, StepPrediction, add_step, hub_of, placed, summed

ALL_RANKS_BUDGET = 1_000_000
"""The most sends and receives the programs of all ranks may hold for every machine to be followed.

Estimated from the first rank's program times the world size; about a second
of Python per million. Past it, a sample of machines stands for all.
"""

_NO_NODE = -1  # the group of a rank on shared network gear, which belongs to no machine


def predict_programs(
    program_of: Callable[[int], RankProgram],
    world_size: int,
    topology: Topology,
    itemsize: int,
    placement: Sequence[str] | None = None,
    *,
    nodes: Iterable[int] | None = None,
    budget: int = ALL_RANKS_BUDGET,
) -> Prediction:
    """Predict a schedule on ``topology`` from its ranks' programs, without its global view.

    Args:
        program_of: rank ``r``'s program, e.g. ``lambda r:
            collectives.algorithms.rank_program("allreduce", "ring", P, n, rank=r)``;
            asked only for the ranks of the machines followed.
        world_size: the number of ranks.
        topology: the machine.
        itemsize: bytes per element.
        placement: the device of each rank; by default rank ``r`` on the ``r``-th GPU.
        nodes: the machines (``Device.node``) whose ranks to follow; by default
            every machine while the programs fit ``budget``, else the first,
            the middle and the last (every one where those are not alike). A
            topology without a hub needs every machine.
        budget: see :data:`ALL_RANKS_BUDGET`.

    Raises:
        TopologyError: the placement does not fit, the programs differ in their
            number of steps, or machines were sampled on a topology without a hub.
    """
    if itemsize < 1:
        raise TopologyError(f"itemsize must be at least 1, got {itemsize}")
    devices = _placement(world_size, topology, placement)
    hub = hub_of(topology)
    followed, sampled = _follow(program_of, world_size, topology, devices, nodes, budget)
    hubs = None if hub is None else HubRoutes(topology, hub)
    prediction, alike = _sum_steps(followed, topology, itemsize, devices, hubs, sampled)
    if sampled is not None and nodes is None and not alike:
        # the machines sampled differ, so they cannot stand for the others: follow every one
        followed, _ = _follow(program_of, world_size, topology, devices, None, sys.maxsize)
        prediction, _ = _sum_steps(followed, topology, itemsize, devices, hubs, None)
    return prediction


def program_traffic(
    program_of: Callable[[int], RankProgram],
    world_size: int,
    topology: Topology,
    placement: Sequence[str] | None = None,
    *,
    budget: int = ALL_RANKS_BUDGET,
) -> Traffic:
    """The :func:`~collectives.topology.cost_model.traffic` of ranks' programs, followed as for a prediction.

    Each step counts the most messages, elements and reduced elements of any
    followed rank; with every machine followed this is the schedule's count.
    """
    devices = _placement(world_size, topology, placement)
    followed, _ = _follow(program_of, world_size, topology, devices, None, budget)
    lengths = {len(program.steps) for _, program in followed}
    steps = messages = elements = reduced = 0
    for index in range(max(lengths, default=0)):
        most = [0, 0, 0]
        for _, program in followed:
            sizes = program.chunk_sizes
            step = program.steps[index]
            sends = [sizes[t.chunk] for t in step.sends if sizes[t.chunk]]
            recvs = [sizes[t.chunk] for t in step.recvs if sizes[t.chunk]]
            into = sum(sizes[t.chunk] for t in step.recvs if t.reduce)
            most = [
                max(most[0], len(sends), len(recvs)),
                max(most[1], sum(sends), sum(recvs)),
                max(most[2], into),
            ]
        if most[0]:
            steps += 1
            messages, elements, reduced = messages + most[0], elements + most[1], reduced + most[2]
    return Traffic(steps, messages, elements, reduced)


def _follow(
    program_of: Callable[[int], RankProgram],
    world_size: int,
    topology: Topology,
    devices: tuple[str, ...],
    nodes: Iterable[int] | None,
    budget: int,
) -> tuple[list[tuple[int, RankProgram]], tuple[int, ...] | None]:
    """The ranks followed with their programs, and the machines sampled (``None`` for all)."""
    hub = hub_of(topology)
    machine = {d.name: (_NO_NODE if d.node is None else d.node) for d in topology.devices}
    groups: dict[int, list[int]] = {}
    for rank, device in enumerate(devices):
        groups.setdefault(machine[device], []).append(rank)
    first = program_of(0)
    if nodes is None:
        keys = list(groups)
        entries = sum(len(step.sends) + len(step.recvs) for step in first.steps)
        if entries * world_size > budget and hub is not None and len(keys) > 2:
            keys = [keys[0], keys[len(keys) // 2], keys[-1]]
    else:
        keys = list(dict.fromkeys(nodes))
        unknown = [key for key in keys if key not in groups]
        if unknown:
            raise TopologyError(f"no rank runs on machine {unknown[0]} of {topology.name}")
    sampled = len(keys) < len(groups)
    if sampled and hub is None:
        raise TopologyError(f"{topology.name} has no one network switch; follow every machine")
    followed = [(rank, first if rank == 0 else program_of(rank)) for key in keys for rank in groups[key]]
    return followed, tuple(keys) if sampled else None


def _sum_steps(
    followed: list[tuple[int, RankProgram]],
    topology: Topology,
    itemsize: int,
    devices: tuple[str, ...],
    hub: HubRoutes | None,
    sampled: tuple[int, ...] | None,
) -> tuple[Prediction, bool]:
    """The prediction from the followed ranks' programs, and whether their machines are alike.

    Alike: each machine's time, per step its busiest link and its longest route,
    summed over the steps, is within 1% of the same on every machine followed.
    """
    lengths = {len(program.steps) for _, program in followed}
    if len(lengths) > 1:
        raise TopologyError(f"the ranks' programs differ in their number of steps: {sorted(lengths)}")
    ranks = {rank for rank, _ in followed}
    machine = {d.name: d.node for d in topology.devices}
    # per rank, per peer: the hops a transfer loads on the followed machines and its route's latency
    sending: dict[int, dict[int, tuple[tuple[LinkId, ...], float]]] = {}
    receiving: dict[int, dict[int, tuple[tuple[LinkId, ...], float]]] = {}

    def way(src: int, dst: int, receiver: bool) -> tuple[tuple[LinkId, ...], float]:
        here, there = devices[src], devices[dst]
        full = topology.route(here, there) if hub is None else hub.route(here, there)
        if hub is None or machine[here] == machine[there]:
            # within a machine the sender (followed, as its whole machine is) loads the route
            return ((), full.latency) if receiver else (full.hops, full.latency)
        # between machines the sender loads the way up to the hub, the receiver the way down
        return (hub.down(there), full.latency) if receiver else (hub.up(here).hops, full.latency)

    widths: dict[LinkId, float] = {}
    hub_name = None if hub is None else hub.hub
    owners = {rank: machine[devices[rank]] for rank in ranks}
    machine_busy: dict[int | None, float] = {}
    total: dict[LinkId, int] = {}
    busy: dict[LinkId, float] = {}
    steps: list[StepPrediction] = []
    # per followed rank: its machine, steps, chunk sizes in bytes, and its ways to and from each peer
    tracks = [
        (
            rank,
            owners[rank],
            program.steps,
            [size * itemsize for size in program.chunk_sizes],
            sending.setdefault(rank, {}),
            receiving.setdefault(rank, {}),
        )
        for rank, program in followed
    ]
    for index in range(lengths.pop() if lengths else 0):
        carried: dict[tuple[LinkId, ...], int] = {}
        latency = 0.0
        moved = 0
        peak: dict[int | None, float] = {}  # per machine: its longest route, then its busiest link
        for rank, owner, program_steps, sizes, to, come in tracks:
            step = program_steps[index]
            mine = 0.0
            for t in step.sends:
                size = sizes[t.chunk]
                if size == 0:
                    continue
                found = to.get(t.dst)
                if found is None:
                    found = to[t.dst] = way(rank, t.dst, False)
                hops, seconds = found
                if seconds > mine:
                    mine = seconds
                moved += size
                carried[hops] = carried.get(hops, 0) + size
            for t in step.recvs if hub is not None else ():  # without a hub, sends loaded whole routes
                size = sizes[t.chunk]
                if size == 0:
                    continue
                found = come.get(t.src)
                if found is None:
                    found = come[t.src] = way(t.src, rank, True)
                hops, seconds = found
                if seconds > mine:
                    mine = seconds
                if t.src not in ranks:
                    moved += size
                carried[hops] = carried.get(hops, 0) + size
            if mine > peak.get(owner, 0.0):
                peak[owner] = mine
            if mine > latency:
                latency = mine
        load: dict[LinkId, int] = {}
        for hops, size in carried.items():
            for hop in hops:
                load[hop] = load.get(hop, 0) + size
        for hop in load.keys() - widths.keys():
            widths[hop] = topology.bandwidth(hop)
        times = {hop: size / widths[hop] for hop, size in load.items()}
        links: dict[int | None, float] = {}
        for hop, seconds in times.items():
            owner = machine[hop[0]] if hop[0] != hub_name else machine[hop[1]]
            links[owner] = max(links.get(owner, 0.0), seconds)
        for owner in peak.keys() | links.keys():
            machine_busy[owner] = machine_busy.get(owner, 0.0) + peak.get(owner, 0.0) + links.get(owner, 0.0)
        add_step(steps, total, busy, load, times, latency, moved)
    followed_machines = {machine[devices[rank]] for rank in ranks}
    per_machine = [machine_busy.get(owner, 0.0) for owner in followed_machines]
    alike = not per_machine or max(per_machine) <= 1.01 * min(per_machine)
    name = followed[0][1].name if followed else ""
    return summed(name, topology, devices, steps, total, busy, sampled), alike


def _placement(world_size: int, topology: Topology, placement: Sequence[str] | None) -> tuple[str, ...]:
    if world_size < 1:
        raise TopologyError(f"world size must be at least 1, got {world_size}")
    return placed(world_size, topology, placement)
