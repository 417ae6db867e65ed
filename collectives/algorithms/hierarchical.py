"""Hierarchical allreduce for machines of several GPUs: reduce within each, allreduce across, gather within.

The P ranks form M nodes of G ranks each, rank ``k * G + j`` being local rank
j of node k. The buffer is cut into G parts, part j into M chunks. First every
node reduce-scatters on a ring of its own ranks, so local rank j holds part j
summed over its node; then the local ranks j of all nodes (a rail, with one
rank per node) allreduce part j on a ring of the nodes, as a reduce-scatter
and an all-gather of its M chunks; last every node all-gathers the parts on
its ring. Only the middle phase crosses the network: each node's network
card carries 2 (M - 1) / M * S each way, against 2 (P - 1) / P * S for a flat
ring over all P ranks, in 2 (M - 1) steps instead of 2 (P - 1); on nodes whose
internal links are much faster than their network card this wins in both
bandwidth and latency.

Cost, for a buffer of S elements, part j of P_j elements (an even split of S
into G) and chunk k of part j of c_(j,k) (an even split of P_j into M), at
rank (k, j):

============================  =====================  ==========================================
phase                         steps                  elements sent by rank (k, j)
============================  =====================  ==========================================
reduce-scatter in the node    G - 1                  S - P_j
reduce-scatter on the rail    M - 1                  P_j - c_(j,k)
all-gather on the rail        M - 1                  P_j - c_(j,k+1 mod M)
all-gather in the node        G - 1                  S - P_(j+1 mod G)
allreduce                     2 (G - 1) + 2 (M - 1)  2 S + P_j - P_(j+1 mod G) - c_(j,k) - c_(j,k+1 mod M)
============================  =====================  ==========================================

A step in a node sends a part as its M chunks, one message each. With G = 1
or M = 1 it is the ring allreduce. By default G is the largest divisor of P
no greater than its square root (P = 32 gives 8 nodes of 4); give the
machines' real G with ``local_size``.
"""

__all__ = [
    "allreduce",
    "cost",
    "default_local_size",
    "for_topology",
    "for_topology_program",
    "rank_program",
    "schedule_traffic",
]

from collections.abc import Sequence
from math import isqrt

from ..chunking import even_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer
from ..topology import Topology, Traffic
from .base import Cost


def default_local_size(world_size: int) -> int:
    """The largest divisor of ``world_size`` no greater than its square root."""
    return max(d for d in range(1, isqrt(world_size) + 1) if world_size % d == 0)


def allreduce(world_size: int, count: int, local_size: int | None = None) -> Schedule:
    """Hierarchical allreduce of ``count`` elements over ``world_size`` ranks in nodes of ``local_size``."""
    g, m = _shape(world_size, local_size)
    parts = even_split(count, g)

    def chunk(part: int, piece: int) -> int:
        return part * m + piece

    def rank(node: int, local: int) -> int:
        return node * g + local

    def node_steps(offset: int, reduce: bool) -> list[Step]:
        # the ring of each node's ranks, moving whole parts as in the ring algorithm
        return [
            Step(
                Transfer(rank(k, j), rank(k, (j + 1) % g), chunk((j - s - offset) % g, piece), reduce=reduce)
                for k in range(m)
                for j in range(g)
                for piece in range(m)
            )
            for s in range(g - 1)
        ]

    def rail_steps(offset: int, reduce: bool) -> list[Step]:
        # the ring of each rail's ranks, one per node, moving the chunks of its part
        return [
            Step(
                Transfer(rank(k, j), rank((k + 1) % m, j), chunk(j, (k - s - offset) % m), reduce=reduce)
                for j in range(g)
                for k in range(m)
            )
            for s in range(m - 1)
        ]

    steps = (
        *node_steps(1, reduce=True),
        *rail_steps(1, reduce=True),
        *rail_steps(0, reduce=False),
        *node_steps(0, reduce=False),
    )
    return Schedule(
        name=f"allreduce-hierarchical(n={world_size},local={g})",
        collective="allreduce",
        world_size=world_size,
        chunk_sizes=tuple(piece for part in parts for piece in even_split(part, m)),
        steps=steps,
    )


def for_topology(collective: str, world_size: int, count: int, topology: Topology) -> Schedule | None:
    """The allreduce with ``topology``'s machines as its nodes; ``None`` unless they are equal and several."""
    local_size = _node_size(collective, world_size, topology)
    return None if local_size is None else allreduce(world_size, count, local_size=local_size)


def _node_size(collective: str, world_size: int, topology: Topology) -> int | None:
    """The ranks per machine of ``topology`` for an allreduce over it; ``None`` unless equal and several."""
    sizes = {len(node) for node in topology.nodes}
    if (
        collective != "allreduce"
        or len(topology.nodes) < 2
        or len(sizes) != 1
        or len(topology.gpus) != world_size
    ):
        return None
    return sizes.pop()


def cost(collective: str, shares: Sequence[int], local_size: int | None = None) -> Cost:
    """Steps and elements sent per rank, from the table above (``sum(shares)`` as S)."""
    if collective != "allreduce":
        raise ValueError(f"the hierarchical algorithm has no {collective!r}")
    g, m = _shape(len(shares), local_size)
    total = sum(shares)
    parts = even_split(total, g)
    chunks = [even_split(part, m) for part in parts]
    sent = tuple(
        2 * total + parts[j] - parts[(j + 1) % g] - chunks[j][k] - chunks[j][(k + 1) % m]
        for k in range(m)
        for j in range(g)
    )
    return Cost(2 * (g - 1) + 2 * (m - 1), sent)


def _shape(world_size: int, local_size: int | None) -> tuple[int, int]:
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    g = default_local_size(world_size) if local_size is None else local_size
    if g < 1 or world_size % g:
        raise ValueError(f"local size {g} does not divide world size {world_size}")
    return g, world_size // g


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part of the default allreduce, from its node and rail neighbours (see ``base``)."""
    if collective != "allreduce":
        return None
    return _program(len(shares), sum(shares), None, rank)


def for_topology_program(
    collective: str, world_size: int, count: int, topology: Topology, rank: int
) -> RankProgram | None:
    """Rank ``rank``'s part of :func:`for_topology`'s schedule, unbuilt; ``None`` where it gives none."""
    local_size = _node_size(collective, world_size, topology)
    return None if local_size is None else _program(world_size, count, local_size, rank)


def _program(size: int, count: int, local_size: int | None, rank: int) -> RankProgram:
    g, m = _shape(size, local_size)
    k, j = divmod(rank, g)
    parts = even_split(count, g)
    right, left = k * g + (j + 1) % g, k * g + (j - 1) % g
    up, down = ((k + 1) % m) * g + j, ((k - 1) % m) * g + j

    def node(offset: int, reduce: bool) -> list[RankStep]:
        return [
            RankStep(
                tuple(Transfer(rank, right, ((j - s - offset) % g) * m + p, reduce) for p in range(m)),
                tuple(Transfer(left, rank, ((j - 1 - s - offset) % g) * m + p, reduce) for p in range(m)),
            )
            for s in range(g - 1)
        ]

    def rail(offset: int, reduce: bool) -> list[RankStep]:
        return [
            RankStep(
                (Transfer(rank, up, j * m + (k - s - offset) % m, reduce),),
                (Transfer(down, rank, j * m + (k - 1 - s - offset) % m, reduce),),
            )
            for s in range(m - 1)
        ]

    return RankProgram(
        name=f"allreduce-hierarchical(n={size},local={g})",
        collective="allreduce",
        world_size=size,
        rank=rank,
        chunk_sizes=tuple(piece for part in parts for piece in even_split(part, m)),
        steps=(*node(1, True), *rail(1, True), *rail(0, False), *node(0, False)),
    )


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The default allreduce's name and counted traffic, by formula (see ``base``).

    Each node step moves every part one hop as its M chunks, so the busiest rank
    moves the largest part, in as many messages as it has non-empty chunks; each
    rail step moves every chunk one hop, so the busiest moves the largest chunk.
    """
    if collective != "allreduce":
        return None
    g, m = _shape(world_size, None)
    name = f"allreduce-hierarchical(n={world_size},local={g})"
    if count == 0 or world_size == 1:
        return name, Traffic(0, 0, 0, 0)
    part = -(-count // g)
    pieces = min(m, part)  # non-empty chunks of the largest part
    chunk = -(-part // m)
    node, rail = g - 1, m - 1
    counted = Traffic(
        2 * (node + rail),
        2 * node * pieces + 2 * rail,
        2 * node * part + 2 * rail * chunk,
        node * part + rail * chunk,
    )
    return name, counted
