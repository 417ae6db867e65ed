"""The seeds' aggregation strategies as allreduce schedules placed on a topology's devices.

Aggregating on one device (a star) sends every buffer to it, which adds them
up and sends the sum back to everyone. Split aggregation gives every rank
1/P of the buffer to aggregate: each sends every other rank that rank's chunk,
then each sends its summed chunk to all. The aggregator may be a device that
is no GPU, such as the CPU: it then takes part as one more rank, after the
GPUs, whose own input (zero, for gradients) joins the sum like any rank's, so
the schedule is still an allreduce the simulator can check.

Cost, for P ranks and a buffer of S elements, rank r aggregating chunk r of S_r:

=============  =====  ===================================================================
schedule       steps  elements sent
=============  =====  ===================================================================
star           2      (P - 1) S by the root, S by every other rank
split_star     2      S - S_r + (P - 1) S_r by rank r; 2 (P - 1) / P * S when P divides S
=============  =====  ===================================================================

(no steps for one rank). The parameter server's round, a push and a pull,
moves the same as split aggregation, with the chunks' aggregators (its servers)
either the ranks themselves (colocated, as :mod:`collectives.kvstore` places
them by default: :func:`split_star`) or ``n`` ranks of their own, after the
workers (:func:`server_program`): each server then receives the m workers'
1/n of the buffer and sends its sum back to all, m S / n each way, the seeds'
O(m / n); with one server, O(m).

On the seeds' PCIe server every link carries 16 GB/s:
aggregating 160 MB on a GPU moves 3 x 160 MB through its link each way, 60 ms;
on the CPU 4 x 160 MB, 80 ms; split, every link carries 3 x 40 MB each way,
15 ms.
"""

__all__ = [
    "Strategy",
    "aggregate_on",
    "server_program",
    "split_aggregation",
    "split_star",
    "split_star_program",
    "star",
]

from collections.abc import Sequence
from dataclasses import dataclass

from ..chunking import even_split
from ..errors import TopologyError
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer
from .graph import Topology


@dataclass(frozen=True)
class Strategy:
    """A schedule and the devices its ranks run on.

    Attributes:
        name: words for a report, e.g. ``aggregate on cpu``.
        schedule: the allreduce schedule.
        placement: the device of each rank.
    """

    name: str
    schedule: Schedule
    placement: tuple[str, ...]


def star(world_size: int, count: int, root: int = 0) -> Schedule:
    """Allreduce through one rank: all send their buffers to ``root``, which sends back the sum."""
    if not 0 <= root < world_size:
        raise ValueError(f"root {root} is outside world size {world_size}")
    others = [r for r in range(world_size) if r != root]
    steps = (
        Step(Transfer(r, root, 0, reduce=True) for r in others),
        Step(Transfer(root, r, 0) for r in others),
    )
    return Schedule(
        name=f"allreduce-star(n={world_size},root={root})",
        collective="allreduce",
        world_size=world_size,
        chunk_sizes=(count,),
        steps=steps if others else (),
    )


def split_star(world_size: int, count: int) -> Schedule:
    """Allreduce with rank ``c`` aggregating chunk ``c``: everyone sends it there, it sends the sum back."""
    size = world_size
    pairs = [(r, c) for c in range(size) for r in range(size) if r != c]
    steps = (
        Step(Transfer(r, c, c, reduce=True) for r, c in pairs),
        Step(Transfer(c, r, c) for r, c in pairs),
    )
    return Schedule(
        name=f"allreduce-split_star(n={size})",
        collective="allreduce",
        world_size=size,
        chunk_sizes=even_split(count, size),
        steps=steps if pairs else (),
    )


def split_star_program(world_size: int, count: int, rank: int) -> RankProgram:
    """Rank ``rank``'s part of :func:`split_star`, without the other ranks' transfers."""
    others = [r for r in range(world_size) if r != rank]
    steps = (
        RankStep(
            tuple(Transfer(rank, c, c, reduce=True) for c in others),
            tuple(Transfer(r, rank, rank, reduce=True) for r in others),
        ),
        RankStep(tuple(Transfer(rank, r, rank) for r in others), tuple(Transfer(c, rank, c) for c in others)),
    )
    return RankProgram(
        name=f"allreduce-split_star(n={world_size})",
        collective="allreduce",
        world_size=world_size,
        rank=rank,
        chunk_sizes=even_split(count, world_size),
        steps=steps if others else (),
    )


def server_program(workers: int, servers: int, count: int, rank: int) -> RankProgram:
    """A parameter server's round: ``workers`` push to ``servers`` ranks of their own, then pull.

    Ranks ``0 .. workers - 1`` are workers, the next ``servers`` ranks servers,
    as :mod:`collectives.kvstore` places dedicated servers last. Server ``k``
    holds chunk ``k`` of an even split of ``count`` elements: in the first step
    every worker sends it that chunk (reduced there), in the second it sends
    the sum back to every worker. Rank ``rank``'s part, for
    :func:`~collectives.topology.programs.predict_programs`.
    """
    if workers < 1 or servers < 1 or not 0 <= rank < workers + servers:
        raise ValueError(f"rank {rank} of {workers} workers and {servers} servers does not exist")
    first = range(workers, workers + servers)
    if rank < workers:
        steps = (
            RankStep(tuple(Transfer(rank, s, s - workers, reduce=True) for s in first), ()),
            RankStep((), tuple(Transfer(s, rank, s - workers) for s in first)),
        )
    else:
        chunk = rank - workers
        steps = (
            RankStep((), tuple(Transfer(w, rank, chunk, reduce=True) for w in range(workers))),
            RankStep(tuple(Transfer(rank, w, chunk) for w in range(workers)), ()),
        )
    return RankProgram(
        name=f"pushpull-servers(workers={workers},servers={servers})",
        collective="allreduce",
        world_size=workers + servers,
        rank=rank,
        chunk_sizes=even_split(count, servers),
        steps=steps,
    )


def aggregate_on(topology: Topology, device: str, count: int, gpus: Sequence[str] | None = None) -> Strategy:
    """Aggregate on ``device``: one of ``gpus`` (the topology's GPUs by default), or a rank after them."""
    topology.device(device)
    ranks = _gpus(topology, gpus)
    if device in ranks:
        return Strategy(f"aggregate on {device}", star(len(ranks), count, ranks.index(device)), ranks)
    placement = (*ranks, device)
    return Strategy(f"aggregate on {device}", star(len(placement), count, len(ranks)), placement)


def split_aggregation(topology: Topology, count: int, gpus: Sequence[str] | None = None) -> Strategy:
    """Aggregate 1/P of the buffer on each of the P ``gpus`` (the topology's GPUs by default)."""
    ranks = _gpus(topology, gpus)
    return Strategy("split aggregation over the GPUs", split_star(len(ranks), count), ranks)


def _gpus(topology: Topology, gpus: Sequence[str] | None) -> tuple[str, ...]:
    ranks = topology.gpus if gpus is None else tuple(gpus)
    if not ranks:
        raise TopologyError(f"{topology.name} has no GPUs to aggregate from")
    for name in ranks:
        topology.device(name)
    return ranks
