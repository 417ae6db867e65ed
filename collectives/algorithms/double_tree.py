"""NCCL's double binary tree allreduce, by collective name for the registry; built in tree.py.

Two complementary binary trees (:func:`.tree.double_binary_tree`), each
carrying half of the pipelined chunks, run at once; every rank is interior in
at most one of them. Its cost is in tree.py's table.
"""

__all__ = ["allreduce", "cost", "rank_program", "schedule_traffic"]

from collections.abc import Sequence

from ..schedule import RankProgram, Schedule
from ..topology.cost_model import Traffic
from .base import Cost
from .tree import (
    double_binary_tree,
    relabelled_place,
    trees_allreduce,
    trees_cost,
    trees_rank_program,
    trees_traffic,
)


def allreduce(world_size: int, count: int, chunks: int | None = None) -> Schedule:
    """Double binary tree allreduce of ``count`` elements over ``world_size`` ranks.

    Args:
        world_size: the number of ranks.
        count: elements in each rank's buffer.
        chunks: chunks the buffer is cut into, the first ``ceil(chunks / 2)``
            through the first tree; :func:`.tree.pipeline_chunks` of ``count`` when ``None``.
    """
    return trees_allreduce(double_binary_tree(world_size), count, chunks, "allreduce-double_tree")


def cost(collective: str, shares: Sequence[int], chunks: int | None = None) -> Cost:
    """Steps and elements sent per rank, from tree.py's tables (``shares`` as for ``ring.cost``)."""
    return trees_cost(collective, double_binary_tree(len(shares)), shares, chunks)


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part, from its places in the two trees (see ``base``)."""
    if collective != "allreduce":
        return None
    size = len(shares)
    places = [relabelled_place(size, rank, second) for second in (False, True)]
    return trees_rank_program(places, size, sum(shares), None, "allreduce-double_tree")


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The name and counted traffic, from one rank of each kind (see ``base``)."""
    if collective != "allreduce":
        return None
    return trees_traffic(double_binary_tree(world_size), count, None, "allreduce-double_tree")
