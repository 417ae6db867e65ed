"""The time of a schedule on a topology, step by step, with the links its transfers share.

Rank ``r`` runs on device ``placement[r]`` (the topology's ``r``-th GPU by
default). Each transfer of a step is routed from its sender's device to its
receiver's, and every link on the way carries its bytes, so transfers that
share a link share its bandwidth. A step lasts as long as its busiest link
needs for all it carries, plus the latency of its longest route:

    step time = max over links (bytes over the link / its bandwidth)
              + max over transfers (sum of the latencies on its route)

and a schedule takes the sum of its steps, as every step waits for the one
before. Transfers of empty chunks cost nothing, as the executor skips them.
The model has no per-message overhead, no overlap of steps and no pipelining
of a chunk across hops; it is meant for comparing schedules.

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

__all__ = ["Prediction", "StepPrediction", "predict"]

from collections.abc import Sequence
from dataclasses import dataclass

from ..errors import TopologyError
from ..schedule import Schedule
from .graph import LinkId, Topology


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
    sizes = schedule.chunk_sizes
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
            route = topology.route(devices[t.src], devices[t.dst])
            latency = max(latency, route.latency)
            moved += size
            for hop in route.hops:
                load[hop] = load.get(hop, 0) + size
        times = {hop: size / topology.bandwidth(hop) for hop, size in load.items()}
        for hop, size in load.items():
            total[hop] = total.get(hop, 0) + size
            busy[hop] = busy.get(hop, 0.0) + times[hop]
        # the first of equally busy links, in schedule order, so reports are stable
        worst = max(times, key=times.__getitem__, default=None)
        bandwidth = 0.0 if worst is None else times[worst]
        steps.append(StepPrediction(bandwidth + latency, bandwidth, latency, worst, moved))
    busiest = max(busy, key=busy.__getitem__, default=None)
    bandwidth_s = sum(s.bandwidth_s for s in steps)
    latency_s = sum(s.latency_s for s in steps)
    return Prediction(
        schedule=schedule.name,
        topology=topology.name,
        placement=devices,
        time_s=bandwidth_s + latency_s,
        bandwidth_s=bandwidth_s,
        latency_s=latency_s,
        busiest_link=busiest,
        busiest_link_s=0.0 if busiest is None else busy[busiest],
        link_bytes=total,
        per_step=tuple(steps),
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
