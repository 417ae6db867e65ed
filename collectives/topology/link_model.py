"""The link model: a schedule's time on the links of a topology, transfers sharing links.

Rank ``r`` runs on device ``placement[r]`` (the
topology's ``r``-th GPU by default). Each transfer of a step is routed from its
sender's device to its receiver's, and every link on the way carries its bytes, so
transfers that share a link share its bandwidth. A step lasts as long as its
busiest link needs for all it carries, plus the latency of its longest route:

    step time = max over links (bytes over the link / its bandwidth)
              + max over transfers (sum of the latencies on its route)

and a schedule takes the sum of its steps, as every step waits for the one
before. Transfers of empty chunks cost nothing, as the executor skips them.
The model has no per-message overhead, no overlap of steps and no pipelining
of a chunk across hops; it is meant for comparing schedules.
:func:`predict_fast` gives the same prediction without searching the route of
every pair of ranks on different nodes (``bench simulate`` uses it at hundreds of ranks).

The seeds' back-of-the-envelope figures count bandwidth alone, so they are
the ``bandwidth_s`` part of a prediction, for 160 MB of float32:

* on ``pcie_switch(4)``, aggregating on one GPU, on the CPU and split over
  the four GPUs take exactly 60, 80 and 15 ms; the latency term adds 4 us
  (two steps of two 1 us hops through the switch);
* on ``dgx1()``, the double- and single-NVLink rings (2:1) take 5.19 ms, not
  the seeds' 2 * 160 MB / (3 * 18 GB/s) = 5.93 ms, "about 6": a ring
  allreduce moves 2 (P - 1) / P of the buffer per rank, 7/4 for 8 GPUs, which
  the seeds round up to 2. Splitting 40 M elements 2:1 and into 8 chunks
  rounds to whole elements, within a millionth of the exact 5.185 ms; the
  14 steps add 14 us of latency. Running both rings both ways halves the
  bandwidth term to 2.59 ms.
"""

__all__ = [
    "HubRoutes",
    "Prediction",
    "StepPrediction",
    "add_step",
    "hub_of",
    "placed",
    "predict",
    "predict_fast",
    "summed",
]

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..errors import TopologyError
from ..schedule import Schedule
from .graph import LinkId, Route, Topology


@dataclass(frozen=True)
class StepPrediction:
    """The predicted time of one step.

    Attributes:
        time_s: ``bandwidth_s + latency_s``.
        bandwidth_s: the time the step's busiest link needs for its bytes.
        latency_s: the latency of the step's longest route.
        busiest_link: that link's direction; ``None`` when nothing moves.
        bytes_moved: bytes of all the step's transfers.
    """

    time_s: float
    bandwidth_s: float
    latency_s: float
    busiest_link: LinkId | None
    bytes_moved: int


@dataclass(frozen=True)
class Prediction:
    """The predicted time of a schedule on a topology.

    Attributes:
        schedule: the schedule's name.
        topology: the topology's name.
        placement: the device of each rank.
        time_s: the whole schedule: ``bandwidth_s + latency_s``.
        bandwidth_s: the sum of the steps' bandwidth terms.
        latency_s: the sum of the steps' latency terms.
        busiest_link: the link direction busy longest over the schedule;
            ``None`` when nothing moves.
        busiest_link_s: the seconds it is busy.
        link_bytes: bytes each link direction carries over the schedule.
        per_step: each step's prediction.
        sampled_nodes: where a sample of machines stood for all
            (:func:`collectives.topology.programs.predict_programs`), the
            machines whose links were followed; ``None`` where every link was.
    """

    schedule: str
    topology: str
    placement: tuple[str, ...]
    time_s: float
    bandwidth_s: float
    latency_s: float
    busiest_link: LinkId | None
    busiest_link_s: float
    link_bytes: dict[LinkId, int]
    per_step: tuple[StepPrediction, ...]
    sampled_nodes: tuple[int, ...] | None = None


def predict(
    schedule: Schedule, topology: Topology, itemsize: int, placement: Sequence[str] | None = None
) -> Prediction:
    """Predict how long ``schedule`` takes on ``topology``.

    Args:
        schedule: any schedule; it is not checked against its contract here.
        topology: the machine.
        itemsize: bytes per element.
        placement: the device each rank runs on, one per rank; by default rank
            ``r`` runs on the topology's ``r``-th GPU. A device that is not a
            GPU may take part, e.g. a CPU aggregating as an extra rank.

    Raises:
        TopologyError: the placement does not fit the schedule or the topology.
    """
    if itemsize < 1:
        raise TopologyError(f"itemsize must be at least 1, got {itemsize}")
    devices = placed(schedule.world_size, topology, placement, schedule.name)
    return _predict(schedule, topology, itemsize, devices, topology.route)


def predict_fast(
    schedule: Schedule, topology: Topology, itemsize: int, placement: Sequence[str] | None = None
) -> Prediction:
    """:func:`predict`, with the routes between nodes joined at the network switch instead of searched.

    :func:`predict` searches the route of every pair of devices that talk, and
    a search between nodes visits every node's devices, so a schedule whose
    ranks all talk to each other costs P searches of O(P) devices each (minutes
    at 512 ranks). Where the nodes meet only at one shared device (the network
    switch of :func:`~collectives.topology.presets.multi_node`), every route
    between nodes runs through it, so the route is the one from the sender up to
    the switch followed by the one from the switch down to the receiver; each is
    searched once per device, and routes within a node are searched as before
    (a search that ends inside the node never leaves it). Links carry the same
    bandwidth and latency either way, so the way down is the way up reversed.
    On any other topology this is :func:`predict`. Arguments and errors as for
    :func:`predict`; the prediction is the same, link by link.
    """
    if itemsize < 1:
        raise TopologyError(f"itemsize must be at least 1, got {itemsize}")
    devices = placed(schedule.world_size, topology, placement, schedule.name)
    hub = hub_of(topology)
    if hub is None:
        return _predict(schedule, topology, itemsize, devices, topology.route)
    return _predict(schedule, topology, itemsize, devices, HubRoutes(topology, hub).route)


class HubRoutes:
    """Routes on a topology whose nodes meet only at one switch (the hub), joined there instead of searched.

    Every route between nodes runs through the hub, so it is the way from the
    sender up to the hub followed by the way from the hub down to the receiver;
    each is searched once per device. Routes within a node are searched as
    before (a search that ends inside the node never leaves it).
    """

    def __init__(self, topology: Topology, hub: str) -> None:
        self.topology = topology
        self.hub = hub
        self.node = {d.name: d.node for d in topology.devices}
        self._latency = {
            hop: link.latency for link in topology.links for hop in ((link.a, link.b), (link.b, link.a))
        }
        self._up: dict[str, Route] = {}
        self._down: dict[str, tuple[LinkId, ...]] = {}

    def up(self, device: str) -> Route:
        """The route from ``device`` to the hub (memoized)."""
        found = self._up.get(device)
        if found is None:
            found = self._up[device] = self.topology.route(device, self.hub)
        return found

    def down(self, device: str) -> tuple[LinkId, ...]:
        """The hops from the hub to ``device``: the way up reversed, as links carry the same both ways."""
        found = self._down.get(device)
        if found is None:
            found = self._down[device] = tuple((b, a) for a, b in reversed(self.up(device).hops))
        return found

    def route(self, src: str, dst: str) -> Route:
        """The route from ``src`` to ``dst``: searched within a node, joined at the hub between nodes."""
        if self.node[src] == self.node[dst]:
            return self.topology.route(src, dst)
        hops = self.up(src).hops + self.down(dst)
        # summed hop by hop, as the search sums it, so the two agree to the last bit
        return Route(hops, sum(self._latency[hop] for hop in hops))


def hub_of(topology: Topology) -> str | None:
    """The one device outside every node, where every link between nodes ends; ``None`` if there is none."""
    shared = [d.name for d in topology.devices if d.node is None]
    if len(shared) != 1 or len(topology.nodes) < 2:
        return None
    node = {d.name: d.node for d in topology.devices}
    for link in topology.links:
        if node[link.a] != node[link.b] and shared[0] not in (link.a, link.b):
            return None
    return shared[0]


def _predict(
    schedule: Schedule,
    topology: Topology,
    itemsize: int,
    devices: tuple[str, ...],
    route_of: Callable[[str, str], Route],
) -> Prediction:
    sizes = schedule.chunk_sizes
    # a step's transfers between the same two ranks share one route; look it up once per pair
    routes: dict[tuple[int, int], Route] = {}
    widths: dict[LinkId, float] = {}
    total: dict[LinkId, int] = {}
    busy: dict[LinkId, float] = {}
    steps: list[StepPrediction] = []
    for step in schedule.steps:
        load: dict[LinkId, int] = {}
        latency = 0.0
        moved = 0
        for t in step.transfers:
            size = sizes[t.chunk] * itemsize
            if size == 0:
                continue
            route = routes.get((t.src, t.dst))
            if route is None:
                route = routes[(t.src, t.dst)] = route_of(devices[t.src], devices[t.dst])
            latency = max(latency, route.latency)
            moved += size
            for hop in route.hops:
                load[hop] = load.get(hop, 0) + size
        for hop in load.keys() - widths.keys():
            widths[hop] = topology.bandwidth(hop)
        times = {hop: size / widths[hop] for hop, size in load.items()}
        add_step(steps, total, busy, load, times, latency, moved)
    return summed(schedule.name, topology, devices, steps, total, busy)


def add_step(
    steps: list[StepPrediction],
    total: dict[LinkId, int],
    busy: dict[LinkId, float],
    load: dict[LinkId, int],
    times: dict[LinkId, float],
    latency: float,
    moved: int,
) -> None:
    """End a step: its links' bytes ``load`` and seconds ``times`` into the running ``total`` and ``busy``."""
    for hop, size in load.items():
        total[hop] = total.get(hop, 0) + size
        busy[hop] = busy.get(hop, 0.0) + times[hop]
    # the first of equally busy links, in schedule order, so reports are stable
    worst = max(times, key=times.__getitem__, default=None)
    bandwidth = 0.0 if worst is None else times[worst]
    steps.append(StepPrediction(bandwidth + latency, bandwidth, latency, worst, moved))


def summed(
    name: str,
    topology: Topology,
    devices: tuple[str, ...],
    steps: list[StepPrediction],
    total: dict[LinkId, int],
    busy: dict[LinkId, float],
    sampled_nodes: tuple[int, ...] | None = None,
) -> Prediction:
    """The prediction of ``steps`` run one after another: their times summed, the busiest link over all."""
    busiest = max(busy, key=busy.__getitem__, default=None)
    bandwidth_s = sum(s.bandwidth_s for s in steps)
    latency_s = sum(s.latency_s for s in steps)
    return Prediction(
        schedule=name,
        topology=topology.name,
        placement=devices,
        time_s=bandwidth_s + latency_s,
        bandwidth_s=bandwidth_s,
        latency_s=latency_s,
        busiest_link=busiest,
        busiest_link_s=0.0 if busiest is None else busy[busiest],
        link_bytes=total,
        per_step=tuple(steps),
        sampled_nodes=sampled_nodes,
    )


def placed(size: int, topology: Topology, placement: Sequence[str] | None, name: str = "") -> tuple[str, ...]:
    """The devices of ``size`` ranks (of schedule ``name``): ``placement`` checked, or the first GPUs."""
    if placement is None:
        if size > len(topology.gpus):
            ranks = f", {name} has {size} ranks" if name else f" for {size} ranks"
            raise TopologyError(f"{topology.name} has {len(topology.gpus)} GPUs{ranks}; give a placement")
        return topology.gpus[:size]
    devices = tuple(placement)
    if len(devices) != size:
        raise TopologyError(f"placement names {len(devices)} devices for {size} ranks")
    for device in devices:
        topology.device(device)
    return devices
