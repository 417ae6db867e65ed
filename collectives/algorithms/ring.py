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

__all__ = ["allgather", "allreduce", "broadcast", "cost", "reduce_scatter"]

from collections.abc import Sequence

from ..chunking import even_split
from ..schedule import Schedule, Step, Transfer
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
    return Schedule(
        name=f"reduce_scatter-ring(n={size})",
        collective="reduce_scatter",
        world_size=size,
        chunk_sizes=tuple(shares),
        steps=tuple(_reduce_scatter_steps(size)),
        chunk_owner=tuple(range(size)),
    )


def allgather(shares: Sequence[int]) -> Schedule:
    """Ring all-gather; rank ``r`` contributes ``shares[r]`` elements and ends with them all."""
    size = len(shares)
    return Schedule(
        name=f"allgather-ring(n={size})",
        collective="allgather",
        world_size=size,
        chunk_sizes=tuple(shares),
        steps=tuple(_allgather_steps(size)),
        chunk_owner=tuple(range(size)),
    )


def allreduce(world_size: int, count: int) -> Schedule:
    """Ring allreduce of ``count`` elements over ``world_size`` ranks."""
    return Schedule(
        name=f"allreduce-ring(n={world_size})",
        collective="allreduce",
        world_size=world_size,
        chunk_sizes=even_split(count, world_size),
        steps=(*_reduce_scatter_steps(world_size), *_allgather_steps(world_size)),
    )


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
    return Schedule(
        name=f"broadcast-ring(n={size}, root={root})",
        collective="broadcast",
        world_size=size,
        chunk_sizes=even_split(count, size),
        steps=tuple(steps),
        root=root,
    )


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
