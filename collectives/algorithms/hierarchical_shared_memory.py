"""Allreduce over nodes: reduce-scatter through each node's shared memory, rings between nodes, all-gather.

The P ranks form M nodes of G ranks each (found by the transport, see
:meth:`collectives.transport.base.Transport.node_split`). The buffer is cut into
G parts. First each node reduce-scatters through its shared memory, as the
``shared_memory`` algorithm does, so its local rank j holds part j summed over the
node; then the local ranks j of all nodes (a rail, one rank per node) allreduce
part j by point-to-point messages, with the algorithm the selector picks for M
ranks (the ring for large parts); last each node all-gathers the parts through
its shared memory. Only the middle phase crosses the network, carrying
2 (M - 1) / M * S / G per rank, against 2 (P - 1) / P * S for a flat ring. It
runs where the transport offers ``shared_memory_nodes`` (:data:`REQUIRES`);
elsewhere its schedule is the ``hierarchical`` algorithm's, messages throughout.

Cost, for a buffer of S elements and parts of S / G:

============================  =====================  ==========================
phase                         steps                  elements moved by a rank
============================  =====================  ==========================
reduce-scatter in the node    barriers               copies, through memory
allreduce on the rail (ring)  2 (M - 1)              2 (M - 1) / M * S / G
all-gather in the node        barriers               copies, through memory
============================  =====================  ==========================
"""

__all__ = [
    "REQUIRES",
    "REQUIRES_TEXT",
    "allreduce",
    "cost",
    "not_supported_reasons",
    "rank_program",
    "ranks_per_node",
    "schedule_traffic",
    "traffic",
]

from collections.abc import Sequence
from dataclasses import replace

from ..schedule import RankProgram, Schedule
from ..topology import Traffic
from . import hierarchical, shared_memory
from .base import Cost

REQUIRES = "shared_memory_nodes"
"""The transport feature this algorithm needs to be chosen by the selector."""

REQUIRES_TEXT = "ranks on several nodes of equal size, sharing memory within each"
"""How the selector says what is missing."""

_PER_NODE = "ranks_per_node="  # the feature that tells the ranks per node, e.g. "ranks_per_node=8"


def ranks_per_node(features: frozenset[str]) -> int | None:
    """The ranks per node a transport's features tell, if they do."""
    for feature in features:
        if feature.startswith(_PER_NODE):
            return int(feature[len(_PER_NODE) :])
    return None


def not_supported_reasons(
    collective: str, world_size: int, count: int, features: frozenset[str]
) -> list[str]:
    """Why nodes of the ranks ``features`` tell cannot hold ``world_size`` ranks; empty if they can.

    A transport tells only node sizes that divide its ranks, but ``explain`` takes
    features from its caller.
    """
    g = ranks_per_node(features)
    if g is not None and (g < 1 or world_size % g):
        return [f"{world_size} ranks do not split into nodes of {g}"]
    return []


def allreduce(world_size: int, count: int) -> Schedule:
    """The same data movement as messages (the hierarchical schedule), for the simulator and others."""
    schedule = hierarchical.allreduce(world_size, count)
    return replace(schedule, name=schedule.name.replace("hierarchical", "hierarchical_shared_memory", 1))


def cost(collective: str, shares: Sequence[int]) -> Cost:
    """Steps and elements sent per rank of :func:`allreduce`'s schedule (the hierarchical algorithm's)."""
    return hierarchical.cost(collective, shares)


def traffic(
    collective: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> tuple[int, int, int, int, int, int]:
    """``(steps, messages, elements, reduced, barriers, copied)`` as the cost model weighs them.

    The node phases are the ``shared_memory`` algorithm's over G ranks; the rail
    phase a ring over M ranks of a part of S / G. The model charges every barrier
    as one over all P ranks, so it overstates their cost (a node's barrier waits
    for G - 1 peers only): a conservative choice.
    """
    g = ranks_per_node(features) or hierarchical.default_local_size(world_size)
    m = world_size // g
    if world_size == 1 or count == 0:
        return (0, 0, 0, 0, 0, 0)
    inside = [shared_memory.traffic(c, g, count, features) for c in ("reduce_scatter", "allgather")]
    part = -(-count // g)
    share = -(-part // m)
    ring_steps = 2 * (m - 1) if part else 0
    steps = sum(t[0] for t in inside) + ring_steps
    elements = sum(t[2] for t in inside) + 2 * (m - 1) * share
    reduced = sum(t[3] for t in inside) + (m - 1) * share
    barriers = sum(t[4] for t in inside)
    copied = sum(t[5] for t in inside)
    return (steps, ring_steps, elements, reduced, barriers, copied)


def _renamed(name: str) -> str:
    return name.replace("hierarchical", "hierarchical_shared_memory", 1)


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part of :func:`allreduce`'s schedule, the hierarchical algorithm's (see ``base``)."""
    program = hierarchical.rank_program(collective, shares, root, rank)
    return None if program is None else replace(program, name=_renamed(program.name))


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The name and counted traffic of :func:`allreduce`'s schedule (see ``base``)."""
    found = hierarchical.schedule_traffic(collective, world_size, count)
    return None if found is None else (_renamed(found[0]), found[1])
