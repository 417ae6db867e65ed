"""The cost model: a schedule's time from alpha-beta-gamma constants, or on the links of a topology.

Both weigh a schedule step by step, as every step waits for the one before.
The closed model (:class:`CostModel`) knows no machine: it counts each step's
critical-path traffic (:func:`traffic`), the most messages, bytes moved and bytes
reduced by any one rank, and charges ``alpha`` per message, ``beta`` per byte
moved and ``gamma`` per byte reduced; its constants come from ``bench calibrate``
(:mod:`collectives.calibration`) or :data:`DEFAULT_MODEL`. The link model
(:func:`predict`) knows the machine and no software: it routes each transfer over
a :class:`~collectives.topology.Topology` and finds the links transfers share.
The selector weighs transfers by the link model where it is given a topology, by
the closed model otherwise, and reductions always by ``gamma``.

The link model, in detail: rank ``r`` runs on device ``placement[r]`` (the
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
    "DEFAULT_MODEL",
    "NETWORK_ALPHA",
    "CostModel",
    "HubRoutes",
    "Prediction",
    "StepPrediction",
    "Traffic",
    "add_step",
    "hub_of",
    "predict",
    "predict_fast",
    "summed",
    "traffic",
]

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import TopologyError
from ..schedule import Schedule
from .graph import LinkId, Route, Topology

_DEFAULT_BARRIER = 5e-6  # see DEFAULT_MODEL
_DEFAULT_COPY = 0.1e-9
_DEFAULT_OVERHEAD = 7e-6
_DEFAULT_STEP = 3e-6


# --- the closed model: alpha, beta and gamma per rank on the critical path


@dataclass(frozen=True)
class Traffic:
    """A schedule's work on its critical path, step by step, as the cost model weighs it.

    Every field sums, over the steps, the most any one rank does in that step;
    transfers of empty chunks are skipped, as the executor skips them.

    Attributes:
        steps: steps that move any data.
        messages: per step, the most messages a rank sends or receives.
        elements: per step, the most elements a rank sends or receives.
        reduced: per step, the most elements a rank reduces.
        barriers: barriers every rank passes (the shared-memory execution's
            synchronisation, in place of messages); none for a schedule of messages.
        copied: elements a rank copies through shared memory (into its region and
            out of the others'), in place of sending them; none for a schedule of messages.
        network_messages: of ``messages``, those of steps that cross between nodes
            (counted where the ranks span several nodes, see :func:`traffic`).
        network_elements: of ``elements``, those of steps that cross between nodes.
        shared_steps: of ``steps``, those through shared memory (a barrier, no
            messages), which cost no step of messages; none for a schedule of messages.
    """

    steps: int
    messages: int
    elements: int
    reduced: int
    barriers: int = 0
    copied: int = 0
    network_messages: int = 0
    network_elements: int = 0
    shared_steps: int = 0

    @property
    def message_steps(self) -> int:
        """Steps that send messages: posted together, then waited for once."""
        return self.steps - self.shared_steps


def traffic(schedule: Schedule, ranks_per_node: int | None = None) -> Traffic:
    """Count ``schedule``'s critical-path traffic (see :class:`Traffic`).

    With ``ranks_per_node``, rank r runs on node r // ranks_per_node (as MPI places a
    job's ranks node by node), and a step with any transfer between nodes is a network
    step: it waits for its slowest link, so all its messages and bytes count as the network's.
    """
    sizes = schedule.chunk_sizes
    steps = messages = elements = reduced = 0
    network_messages = network_elements = 0
    g = ranks_per_node
    for step in schedule.steps:
        sends: dict[int, int] = {}
        recvs: dict[int, int] = {}
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        reducing: dict[int, int] = {}
        for t in step.transfers:
            n = sizes[t.chunk]
            if n == 0:
                continue
            sends[t.src] = sends.get(t.src, 0) + 1
            recvs[t.dst] = recvs.get(t.dst, 0) + 1
            sent[t.src] = sent.get(t.src, 0) + n
            received[t.dst] = received.get(t.dst, 0) + n
            if t.reduce:
                reducing[t.dst] = reducing.get(t.dst, 0) + n
        if not sends:
            continue
        steps += 1
        # links are full duplex: a rank's sends and receives overlap, its messages to
        # different peers do not (they share its one CPU and network port)
        step_messages = max(*sends.values(), *recvs.values())
        step_elements = max(*sent.values(), *received.values())
        messages += step_messages
        elements += step_elements
        reduced += max(reducing.values(), default=0)
        if g and any(t.src // g != t.dst // g for t in step.transfers if sizes[t.chunk]):
            network_messages += step_messages
            network_elements += step_elements
    return Traffic(steps, messages, elements, reduced, 0, 0, network_messages, network_elements)


NETWORK_ALPHA = 20e-6
"""Seconds per message between nodes without a calibration of the job's shape (``network_alpha``).

MPI over a cluster network takes a few microseconds a message on the wire, more
through the software of each side; 20 us is a round figure of that. Per byte the
network is taken to be as fast as memory (``network_beta`` defaults to ``beta``)
until ``bench calibrate`` measures both on a job that spans nodes.
"""


@dataclass(frozen=True)
class CostModel:
    """Time of a schedule: per step, alpha per message, beta per byte moved, gamma per byte reduced.

    A step's time is ``step + alpha * m + beta * b + gamma * r``, where ``m``, ``b`` and
    ``r`` are the most messages, bytes moved and bytes reduced by any rank in the
    step (see :class:`Traffic`); the executor reduces after a step's transfers
    complete, so the terms add. ``step`` is what a step of messages costs whatever it moves (the
    executor posts its messages together and waits for them once, so a step of three
    messages costs little more than a step of one), and every call pays ``overhead``
    once (its checks, the agreement on its signature, the copy of nothing), the same
    for every algorithm. There are two classes of link: within a node
    (shared memory; ``alpha``, ``beta``) and between nodes (the network;
    ``network_alpha``, ``network_beta``); a step that crosses between nodes is
    charged at the network's constants. A schedule's time is the sum over its steps. An
    execution through shared memory synchronises by barriers instead of messages,
    each costing ``barrier * (P - 1)``: a rank waits for the arrival of each of the
    P - 1 others, and on a busy node for each of them to be scheduled; and it copies
    bytes once, at ``copy`` per byte, where a message over MPI's shared memory
    copies them twice (into a shared cell and out) and pays MPI's software besides.

    Attributes:
        alpha: seconds per message (latency and per-message software overhead).
        beta: seconds per byte a rank sends or receives (the inverse bandwidth).
        gamma: seconds per byte a rank reduces.
        barrier: seconds per shared-memory barrier and per peer it waits for.
        copy: seconds per byte a rank copies through shared memory.
        network_alpha: seconds per message between nodes.
        network_beta: seconds per byte between nodes; ``None``: as ``beta``.
        overhead: seconds per call, whatever the algorithm.
        step: seconds per step of messages, whatever it moves.
        corrections: per algorithm, ``(bytes, measured / predicted)`` at the sizes
            ``bench calibrate`` timed it, ascending: what the constants alone miss of
            that algorithm on this job (see :meth:`correction`); empty uncalibrated.
        source: where the constants came from, for explanations.
    """

    alpha: float
    beta: float
    gamma: float
    barrier: float = _DEFAULT_BARRIER
    copy: float = _DEFAULT_COPY
    network_alpha: float = NETWORK_ALPHA
    network_beta: float | None = None
    overhead: float = 0.0
    step: float = 0.0
    corrections: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    source: str = field(default="given", compare=False)

    def correction(self, algorithm: str, nbytes: int) -> float:
        """The factor ``algorithm``'s prediction for a buffer of ``nbytes`` is multiplied by (1.0: none).

        At a size the calibration timed, its measured time over the constants'
        prediction; between two, interpolated geometrically in the logarithm of the
        size; beyond the first or last, that one's. An algorithm the calibration did
        not time has none.
        """
        points = next((p for name, p in self.corrections if name == algorithm), None)
        if not points:
            return 1.0
        if nbytes <= points[0][0]:
            return points[0][1]
        for (low, below), (high, above) in itertools.pairwise(points):
            if nbytes <= high:
                share = math.log(nbytes / low) / math.log(high / low)
                return float(below * (above / below) ** share)
        return points[-1][1]

    @property
    def between_beta(self) -> float:
        """Seconds per byte between nodes: ``network_beta``, or ``beta`` where it is not known."""
        return self.beta if self.network_beta is None else self.network_beta

    def barrier_time(self, world_size: int) -> float:
        """Seconds of one shared-memory barrier over ``world_size`` ranks."""
        return self.barrier * max(world_size - 1, 0)

    def time(self, counted: Traffic, itemsize: int, world_size: int) -> float:
        """Predicted seconds of ``counted`` traffic, ``itemsize``-byte elements, over ``world_size`` ranks."""
        return sum(self.terms(counted, itemsize, world_size))

    def terms(
        self, counted: Traffic, itemsize: int, world_size: int, *, ranks_per_node: int | None = None
    ) -> tuple[float, float, float]:
        """Seconds of ``counted``: latency (call, steps, alpha, barriers), transfer (beta, copy), reduction.

        With ``ranks_per_node``, the ranks span several nodes of that many: the
        messages and bytes of steps that cross between nodes (``counted.network_*``)
        are charged at the network's constants, the rest at the node's, and a
        barrier is a node's.
        """
        barrier_ranks = world_size
        messages, elements = counted.messages, counted.elements
        between = 0.0, 0.0
        if ranks_per_node is not None:
            barrier_ranks = ranks_per_node
            messages -= counted.network_messages
            elements -= counted.network_elements
            between = (
                self.network_alpha * counted.network_messages,
                self.between_beta * counted.network_elements * itemsize,
            )
        latency = (
            self.overhead
            + self.step * counted.message_steps
            + self.alpha * messages
            + between[0]
            + self.barrier_time(barrier_ranks) * counted.barriers
        )
        transfer = self.beta * elements * itemsize + between[1] + self.copy * counted.copied * itemsize
        return latency, transfer, self.gamma * counted.reduced * itemsize

    def predict(self, schedule: Schedule, itemsize: int) -> float:
        """Predicted seconds of ``schedule`` for elements of ``itemsize`` bytes."""
        return self.time(traffic(schedule), itemsize, schedule.world_size)

    def describe(self) -> str:
        """One line with the constants in readable units and their source."""
        bandwidth = f"{1e-9 / self.beta:.2f} GB/s" if self.beta > 0 else "unbounded"
        return (
            f"alpha {self.alpha * 1e6:.2f} us/message, beta {self.beta * 1e9:.4f} ns/byte ({bandwidth}), "
            f"gamma {self.gamma * 1e9:.4f} ns/byte, barrier {self.barrier * 1e6:.2f} us/peer, "
            f"copy {self.copy * 1e9:.4f} ns/byte, step {self.step * 1e6:.2f} us, "
            f"call {self.overhead * 1e6:.2f} us"
            + (f", measured corrections for {len(self.corrections)} algorithms" if self.corrections else "")
            + f"; {self.source}"
        )

    def link_classes(self, nodes: int | None = None) -> list[str]:
        """One line per class of link of a job on ``nodes`` nodes: within a node, and between nodes."""
        inside = f"alpha {self.alpha * 1e6:.2f} us, beta {self.beta * 1e9:.4f} ns/byte"
        lines = [f"within a node (shared memory): {inside}"]
        if nodes is not None and nodes > 1:
            lines.append(
                f"between {nodes} nodes (network): alpha {self.network_alpha * 1e6:.2f} us, "
                f"beta {self.between_beta * 1e9:.4f} ns/byte"
            )
        return lines


DEFAULT_MODEL = CostModel(
    alpha=3e-6,
    beta=0.24e-9,
    gamma=0.07e-9,
    barrier=_DEFAULT_BARRIER,
    copy=_DEFAULT_COPY,
    overhead=_DEFAULT_OVERHEAD,
    step=_DEFAULT_STEP,
    source="defaults",
)
"""The constants without a calibration file: alpha 3 us, beta 0.24 ns/byte, gamma 0.07 ns/byte,
barrier 5 us, copy 0.1 ns/byte, a step of messages 3 us, a call 7 us.

The per-call, per-step and per-byte constants (overhead, step + alpha, beta, copy)
are :func:`bench.fitting.fit_model`'s fit to ``python -m bench compare`` at 2 ranks on
the quiet 2-core VM (``bench/compare-2ranks.json``: ring, butterfly and shared_memory,
8 B to 16 MiB), which predicts every one of those 24 calls within 30% (medians 2-5%):
7 us a call, 6 us a step of one message (at 2 ranks a step is one message, so the
fit cannot split step from alpha: half each), 0.24 ns/byte sent, 0.10 ns/byte copied
through shared memory. Before, the model had no per-call or per-step cost and
predicted about half the measured time, with beta 0.1 and copy 0.03 ns/byte
chosen so that its choices were those measured; the fitted constants keep those
choices on one node (shared_memory at every size at 2 and 4 ranks) and, across
nodes, no longer make the shared-memory hierarchy's copies look 3 times cheaper
than the bytes its rivals send (it was chosen at 2 MiB on 2 x 2 and ran 1.5x the fastest).
The earlier history of these constants:

Measured with ``python -m bench calibrate -n 100`` under ``mpiexec -n 2`` on a
2-core Linux VM (MPICH 5.0 over shared memory, numpy 2.4 float32 sums, each case
timed by its least disturbed iteration), six runs while other jobs loaded the
cores: alpha ranged 3.6 to 13 us, beta 0.065 to 0.16 ns/byte, gamma 0.061 to 0.089
ns/byte; these are their medians, rounded. alpha is mostly the Python cost of
posting and waiting on a step's messages. The barrier measured 1.6 us per peer at
2 ranks on the quiet machine and 2 to 14 us at 2 and 4 ranks on a loaded one; 5 us
is between. The copy through shared memory measured 0.074 ns/byte by ``bench
calibrate`` (4 MiB in the executor's segments, barriers taken off), but with that
figure the model prefers ring at every size, where ``python -m bench compare``
measured the shared-memory allreduce 20-40% faster than ring from 4 MiB at 2 ranks
and as fast at 4 ranks: the exchanges beta comes from are timed warm in cache,
the collectives are not. 0.03 ns/byte makes the model's choices those measured.
``bench calibrate`` now fits beta and copy to ring and shared-memory allreduces
timed end to end on cold buffers (medians), so a calibration makes the same
choices (2 ranks: beta 0.27, copy 0.10 ns/byte). Run it on your own machine for
choices made for it.
"""


# --- the link model: transfers routed over a topology, sharing its links


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
    devices = _placement(schedule, topology, placement)
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
    devices = _placement(schedule, topology, placement)
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


def _placement(schedule: Schedule, topology: Topology, placement: Sequence[str] | None) -> tuple[str, ...]:
    size = schedule.world_size
    if placement is None:
        if size > len(topology.gpus):
            raise TopologyError(
                f"{topology.name} has {len(topology.gpus)} GPUs, {schedule.name} has {size} ranks; "
                "give a placement"
            )
        return topology.gpus[:size]
    devices = tuple(placement)
    if len(devices) != size:
        raise TopologyError(f"placement names {len(devices)} devices for {size} ranks")
    for name in devices:
        topology.device(name)
    return devices
