"""Ring reduce-scatter, all-gather, allreduce and broadcast.

The ranks form a ring, each sending only to its right neighbour ``r + 1`` and
receiving only from its left neighbour ``r - 1``, and the buffer is cut into
one chunk per rank. In reduce-scatter, chunk ``c`` starts at rank ``c + 1`` and
travels once round the ring, each rank adding its own copy, until rank ``c``
receives it with every contribution. All-gather sends each rank's chunk round
the ring the same way, overwriting instead of adding. Allreduce is
reduce-scatter followed by all-gather. Every link carries traffic at every
step, so the time hardly grows with the number of ranks. Broadcast is a
pipelined chain: the ring opened before the root, the root sending one chunk a
step to its right neighbour, each rank passing on the chunk it received the
step before, so the chain is full after P - 1 steps.

Cost, for P ranks and a buffer of S elements whose share at rank r is S_r:

=================  ============  ================================
collective         steps         elements sent by rank r
=================  ============  ================================
reduce_scatter     P - 1         S - S_r
allgather          P - 1         S - S_(r+1 mod P)
allreduce          2 (P - 1)     2 S - S_r - S_(r+1 mod P)
broadcast          2 (P - 1)     S; none by rank root - 1 mod P
=================  ============  ================================

That is (P - 1) / P * S per phase when P divides S; allreduce and broadcast
share the buffer evenly, the first S mod P chunks one element larger.
"""

__all__ = [
    "allgather",
    "allreduce",
    "broadcast",
    "cost",
    "rank_program",
    "reduce_scatter",
    "ring_traffic",
    "schedule_traffic",
]

from collections.abc import Sequence

from ..chunking import even_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer, share_schedule
from ..topology.cost_model import Traffic
from .base import Cost


def _reduce_scatter_steps(size: int) -> list[Step]:
    # at step s rank r passes on chunk r - s - 1, the one it reduced last step
    return [
        Step(Transfer(r, (r + 1) % size, (r - s - 1) % size, reduce=True) for r in range(size))
        for s in range(size - 1)
    ]


def _allgather_steps(size: int) -> list[Step]:
    # at step s rank r passes on chunk r - s: its own first, then what it received
    return [Step(Transfer(r, (r + 1) % size, (r - s) % size) for r in range(size)) for s in range(size - 1)]


def reduce_scatter(shares: Sequence[int]) -> Schedule:
    """Ring reduce-scatter; rank ``r`` ends with its share of ``shares[r]`` elements reduced."""
    size = len(shares)
    return share_schedule("reduce_scatter", "ring", shares, _reduce_scatter_steps(size))


def allgather(shares: Sequence[int]) -> Schedule:
    """Ring all-gather; rank ``r`` contributes ``shares[r]`` elements and ends with them all."""
    size = len(shares)
    return share_schedule("allgather", "ring", shares, _allgather_steps(size))


def allreduce(world_size: int, count: int) -> Schedule:
    """Ring allreduce of ``count`` elements over ``world_size`` ranks."""
    steps = (*_reduce_scatter_steps(world_size), *_allgather_steps(world_size))
    return Schedule.named("allreduce", "ring", world_size, even_split(count, world_size), steps)


def broadcast(world_size: int, count: int, root: int) -> Schedule:
    """Pipelined chain broadcast of ``count`` elements from ``root``, in P chunks."""
    size = world_size
    # at step t the rank i places after the root passes on chunk t - i, if there is one
    steps = [
        Step(
            Transfer((root + i) % size, (root + i + 1) % size, t - i)
            for i in range(size - 1)
            if 0 <= t - i < size
        )
        for t in range(2 * (size - 1))
    ]
    return Schedule.named("broadcast", "ring", size, even_split(count, size), steps, root=root)


def cost(collective: str, shares: Sequence[int], root: int = 0) -> Cost:
    """Steps and elements sent per rank, from the table above (``shares`` as the chunks)."""
    size = len(shares)
    total = sum(shares)
    if collective == "reduce_scatter":
        return Cost(size - 1, tuple(total - shares[r] for r in range(size)))
    if collective == "allgather":
        return Cost(size - 1, tuple(total - shares[(r + 1) % size] for r in range(size)))
    if collective == "allreduce":
        return Cost(
            2 * (size - 1),
            tuple(2 * total - shares[r] - shares[(r + 1) % size] for r in range(size)),
        )
    if collective == "broadcast":
        last = (root - 1) % size
        return Cost(2 * (size - 1), tuple(0 if r == last else total for r in range(size)))
    raise ValueError(f"the ring has no {collective!r}")


def _ring_rank_steps(size: int, rank: int, offset: int, reduce: bool) -> list[RankStep]:
    # the rank's part of _reduce_scatter_steps (offset 1) or _allgather_steps (offset 0)
    right, left = (rank + 1) % size, (rank - 1) % size
    return [
        RankStep(
            (Transfer(rank, right, (rank - s - offset) % size, reduce),),
            (Transfer(left, rank, (left - s - offset) % size, reduce),),
        )
        for s in range(size - 1)
    ]


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part of the ring's schedule, from its neighbours alone (see ``base``)."""
    size = len(shares)
    if collective == "reduce_scatter":
        steps = _ring_rank_steps(size, rank, 1, reduce=True)
    elif collective == "allgather":
        steps = _ring_rank_steps(size, rank, 0, reduce=False)
    elif collective == "allreduce":
        steps = [*_ring_rank_steps(size, rank, 1, True), *_ring_rank_steps(size, rank, 0, False)]
        shares = even_split(sum(shares), size)
    elif collective == "broadcast" and root is not None:
        return _broadcast_program(shares, root, rank)
    else:
        return None
    owner = None if collective == "allreduce" else range(size)
    return RankProgram.named(collective, "ring", size, shares, steps, rank=rank, chunk_owner=owner)


def _broadcast_program(shares: tuple[int, ...], root: int, rank: int) -> RankProgram:
    size = len(shares)
    place = (rank - root) % size  # i of broadcast(): the rank's place after the root
    right, left = (rank + 1) % size, (rank - 1) % size
    steps = tuple(
        RankStep(
            (Transfer(rank, right, t - place),) if place < size - 1 and 0 <= t - place < size else (),
            (Transfer(left, rank, t - place + 1),) if place > 0 and 0 <= t - place + 1 < size else (),
        )
        for t in range(2 * (size - 1))
    )
    chunks = even_split(sum(shares), size)
    return RankProgram.named("broadcast", "ring", size, chunks, steps, rank=rank, root=root)


def ring_traffic(world_size: int, count: int, phases: int, reducing: int) -> Traffic:
    """The counted traffic of ``phases`` ring phases of ``P - 1`` steps, ``reducing`` of them reducing.

    Every step moves every chunk of ``even_split(count, P)`` one hop, one per
    rank, so the busiest rank of each moves the largest chunk, ``ceil(count / P)``.
    """
    if world_size == 1 or count == 0:
        return Traffic(0, 0, 0, 0)
    steps = phases * (world_size - 1)
    largest = -(-count // world_size)
    return Traffic(steps, steps, steps * largest, reducing * (world_size - 1) * largest)


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The schedule's name and counted traffic, by formula (see ``base``)."""
    size = world_size
    if collective == "broadcast":
        # at step t chunks max(0, t - P + 2) .. min(t, P - 1) move, one per rank; the first is largest
        sizes = even_split(count, size)
        largest = [sizes[max(0, t - size + 2)] for t in range(2 * (size - 1))]
        moving = [n for n in largest if n]
        counted = Traffic(len(moving), len(moving), sum(moving), 0)
        return f"broadcast-ring(n={size}, root=0)", counted
    phases = {"reduce_scatter": (1, 1), "allgather": (1, 0), "allreduce": (2, 1)}.get(collective)
    if phases is None:
        return None
    return f"{collective}-ring(n={size})", ring_traffic(size, count, *phases)
