"""Binary tree and double binary tree allreduce, pipelined over chunks, and the tree shapes.

The tree is the in-order binary tree of the keys ``1..P`` (rank ``r`` has key
``r + 1``): the root of a run of keys is the one with the most trailing zero
bits, and the runs either side of it hang under it. So the root is rank
``2^m - 1`` with ``m = floor(log2 P)``, the depth is ``m``, the even ranks are
leaves, and the odd ranks are interior with two children, except rank
``P - 1`` when P is even, which has one. Tree neighbours are near in rank.

Allreduce cuts the buffer into K chunks and streams them through the tree:
chunk ``c`` leaves a rank at depth ``d`` for its parent at step ``c + m - d``,
both children of a rank sending in the same step and added in the order
(own, first child, second child). The root sends chunk ``c`` back down at step
``c + m``, as soon as its sum is complete, and it descends a level a step, so
the two streams overlap; every rank ends with the root's bits.

The double binary tree (NCCL's) streams the first ``ceil(K / 2)`` chunks
through that tree and the rest, at the same time, through its complement: the
tree mirrored (``r -> P - 1 - r``) for even P, shifted (``r -> r + 1 mod P``)
for odd P. Either takes the odd ranks, the first tree's interior, to even ranks,
leaves of the second (the shift's wrap takes rank ``P - 1``, a leaf for odd P,
to rank 0, a leaf in both), so every rank is interior in at most one tree.

Cost, for P > 1 ranks, S elements in K chunks (S1 and S2 of them through the
first and second tree) and ``m = floor(log2 P)``; nothing for P = 1:

===========  =====================  =========================================
algorithm    steps                  elements sent by rank r
===========  =====================  =========================================
tree         K + 2 m - 1            ``S * sent(r's role)``
double_tree  ceil(K / 2) + 2 m - 1  ``S1 * sent(role in 1) + S2 * sent(role in 2)``
ring         2 (P - 1)              ``2 S (P - 1) / P`` when P divides S
===========  =====================  =========================================

where ``sent`` counts a rank's copies of each element, one to its parent and
one to each child: 1 for a leaf, 3 for an interior rank with two children, 2
for rank ``P - 1`` with one (P even), and for the root 2, or 1 when P is a
power of two (the root is then rank ``P - 1``). All ranks together send
``2 (P - 1) S``, as in the ring, but unevenly: the busiest sends ``3 S`` in the
tree and ``3 S1 + S2``, about ``2 S``, in the double tree. The seeds' table
gives the tree ``2 log2 P`` rounds, ours for K = 1; its per-node volume,
``2 n log2 K / K`` as printed, is an average that hides the interior ranks'
``3 S``. Pipelining trades ``2 m`` steps of S for ``K + 2 m - 1`` steps of
``S / K``.

The reduce and broadcast halves are separate helpers taking any tree, rooted
anywhere, so tree reduce and broadcast need only their collectives' specs.
"""

__all__ = [
    "MAX_PIPELINE_CHUNKS",
    "PIPELINE_GRAIN",
    "Tree",
    "allreduce",
    "binary_tree",
    "cost",
    "double_binary_tree",
    "pipeline_chunks",
    "rank_program",
    "relabelled_place",
    "schedule_traffic",
    "trees_allreduce",
    "trees_cost",
    "trees_rank_program",
    "trees_traffic",
]

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from math import isqrt

from ..chunking import bounds, even_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer
from ..topology.cost_model import Traffic
from .base import Cost

PIPELINE_GRAIN = 65536
"""Elements that make the default pipelining depth grow as ``sqrt(count / PIPELINE_GRAIN)``."""
MAX_PIPELINE_CHUNKS = 64
"""The most chunks the default cuts a buffer into."""

Move = tuple[int, Transfer]
"""A transfer and the step it happens in."""


@dataclass(frozen=True)
class Tree:
    """A tree spanning the ranks ``0..P-1``.

    Attributes:
        root: the rank at the top.
        parent: each rank's parent; ``None`` for the root.
        children: each rank's children, in the order their contributions are
            reduced into it.
    """

    root: int
    parent: tuple[int | None, ...]
    children: tuple[tuple[int, ...], ...]

    @property
    def world_size(self) -> int:
        return len(self.parent)

    @cached_property
    def depth(self) -> tuple[int, ...]:
        """Each rank's distance from the root."""
        depth = [0] * self.world_size
        pending = [self.root]
        while pending:
            rank = pending.pop()
            for child in self.children[rank]:
                depth[child] = depth[rank] + 1
                pending.append(child)
        return tuple(depth)

    @property
    def height(self) -> int:
        """The greatest depth of any rank."""
        return max(self.depth)

    @property
    def interior(self) -> frozenset[int]:
        """The ranks with children."""
        return frozenset(rank for rank, below in enumerate(self.children) if below)

    def relabel(self, rank_of: Callable[[int], int]) -> "Tree":
        """The same shape with rank ``r`` renamed ``rank_of(r)``, a permutation of the ranks."""
        size = self.world_size
        parent: list[int | None] = [None] * size
        children: list[tuple[int, ...]] = [()] * size
        for rank in range(size):
            above = self.parent[rank]
            parent[rank_of(rank)] = None if above is None else rank_of(above)
            children[rank_of(rank)] = tuple(rank_of(child) for child in self.children[rank])
        return Tree(rank_of(self.root), tuple(parent), tuple(children))


def _in_order_tree(world_size: int) -> Tree:
    """The in-order tree of keys ``1..P`` by trailing zero bits, as ranks ``key - 1``."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    parent: list[int | None] = [None] * world_size
    children: list[list[int]] = [[] for _ in range(world_size)]

    def build(lo: int, hi: int) -> int:
        # the keys lo..hi, lo <= hi; returns the root's rank. The key with the most trailing
        # zeros is hi with the bits below the highest one where lo - 1 and hi differ cleared.
        top = 1 << (((lo - 1) ^ hi).bit_length() - 1)
        key = hi & -top
        for start, stop in ((lo, key - 1), (key + 1, hi)):
            if start <= stop:
                child = build(start, stop)
                parent[child] = key - 1
                children[key - 1].append(child)
        return key - 1

    root = build(1, world_size)
    return Tree(root, tuple(parent), tuple(tuple(c) for c in children))


def _rotated(tree: Tree, root: int | None) -> Tree:
    """``tree`` with its ranks rotated so that its root is ``root`` (unchanged for ``None``)."""
    size = tree.world_size
    if root is None:
        return tree
    if not 0 <= root < size:
        raise ValueError(f"root {root} is outside 0..{size - 1}")
    shift = root - tree.root
    return tree.relabel(lambda rank: (rank + shift) % size)


def binary_tree(world_size: int, root: int | None = None) -> Tree:
    """The binary tree over ``world_size`` ranks described above, of depth ``floor(log2 P)``.

    Args:
        world_size: the number of ranks.
        root: the rank at the top; the ranks are rotated to put it there. By
            default the in-order root, rank ``2^floor(log2 P) - 1``.
    """
    return _rotated(_in_order_tree(world_size), root)


def double_binary_tree(world_size: int, root: int | None = None) -> tuple[Tree, Tree]:
    """Two binary trees over the same ranks in which every rank is interior in at most one.

    The first is :func:`binary_tree`; the second is the first mirrored (P even)
    or shifted by one rank (P odd), both then rotated alike when ``root`` is
    given. The second tree's root is then the first's mirror or neighbour.

    Args:
        world_size: the number of ranks.
        root: the first tree's root, as for :func:`binary_tree`.
    """
    first = _in_order_tree(world_size)
    size = world_size
    if size % 2 == 0:
        second = first.relabel(lambda rank: size - 1 - rank)
    else:
        second = first.relabel(lambda rank: (rank + 1) % size)
    if root is None:
        return first, second
    rotated = _rotated(first, root)
    shift = rotated.root - first.root
    return rotated, second.relabel(lambda rank: (rank + shift) % size)


def pipeline_chunks(count: int) -> int:
    """The default pipelining depth: ``isqrt(count // PIPELINE_GRAIN)``, within 1..MAX_PIPELINE_CHUNKS.

    Each chunk adds a step, and each step costs a latency ``a``, while smaller
    chunks shorten the ``2 m - 1`` steps of filling and draining the tree. With
    an interior rank sending three chunks a step at ``b`` seconds per byte, the
    time ``(K + 2 m - 1) (a + 3 b 4 S / K)`` for float32 is least at
    ``K = sqrt(12 (2 m - 1) b S / a)``, which is ``sqrt(S / 65536)`` at depth 2
    when ``a / b`` is 2.4 MB: 0.5 ms at 5 GB/s. On a shared 2-core machine a
    step of this executor over MPI shared memory cost 0.1 ms beyond its bytes
    with a core per rank and about 1 ms with ranks sharing cores, and 4 to 16
    chunks were best at 4M elements. So one chunk below 256K elements, 4 at 1M,
    8 at 4M, and at most 64, which bounds the schedule's size; a faster
    executor would want a smaller grain. The depth is left out so that the
    default depends on the count alone.
    """
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    return min(MAX_PIPELINE_CHUNKS, max(1, isqrt(count // PIPELINE_GRAIN)))


def _reduce_moves(tree: Tree, chunks: Iterable[int], start: int = 0) -> Iterator[Move]:
    """Pipelined reduce to ``tree.root``: the j-th chunk leaves depth d at step ``start + j + height - d``.

    Both children of a rank send in the same step, listed first child first,
    so the rank adds them in that order.
    """
    height = tree.height
    for j, chunk in enumerate(chunks):
        for rank, below in enumerate(tree.children):
            for child in below:
                yield start + j + height - tree.depth[child], Transfer(child, rank, chunk, reduce=True)


def _broadcast_moves(tree: Tree, chunks: Iterable[int], start: int = 0) -> Iterator[Move]:
    """Pipelined broadcast from ``tree.root``: the j-th chunk leaves depth d at step ``start + j + d``."""
    for j, chunk in enumerate(chunks):
        for rank, below in enumerate(tree.children):
            for child in below:
                yield start + j + tree.depth[rank], Transfer(rank, child, chunk)


def _allreduce_moves(tree: Tree, chunks: Sequence[int]) -> Iterator[Move]:
    # the root sends chunk j down at step j + height, the step after its sum is complete
    yield from _reduce_moves(tree, chunks)
    yield from _broadcast_moves(tree, chunks, start=tree.height)


def _steps(moves: Iterable[Move]) -> tuple[Step, ...]:
    """The moves as steps, each step's transfers in the order the moves came."""
    by_step: defaultdict[int, list[Transfer]] = defaultdict(list)
    for step, transfer in moves:
        by_step[step].append(transfer)
    return tuple(Step(by_step[step]) for step in range(max(by_step, default=-1) + 1))


def _tree_chunks(chunks: int, trees: int) -> list[range]:
    """The chunks each tree carries: consecutive runs, the first ``chunks % trees`` one longer."""
    starts = bounds(even_split(chunks, trees))
    return [range(starts[t], starts[t + 1]) for t in range(trees)]


def _check_chunks(chunks: int | None, count: int) -> int:
    if chunks is None:
        return pipeline_chunks(count)
    if chunks < 1:
        raise ValueError(f"chunks must be at least 1, got {chunks}")
    return chunks


def trees_allreduce(trees: Sequence[Tree], count: int, chunks: int | None, name: str) -> Schedule:
    """Allreduce of ``count`` elements streamed through several trees at once.

    Args:
        trees: trees over the same ranks; the t-th carries the t-th run of chunks.
        count: elements in each rank's buffer.
        chunks: chunks the buffer is cut into; :func:`pipeline_chunks` when ``None``.
        name: the schedule's name, e.g. ``allreduce-tree``; the parameters are appended.
    """
    size = trees[0].world_size
    total = _check_chunks(chunks, count)
    carried = _tree_chunks(total, len(trees))
    moves = (move for tree, mine in zip(trees, carried, strict=True) for move in _allreduce_moves(tree, mine))
    return Schedule(
        name=f"{name}(n={size},chunks={total})",
        collective="allreduce",
        world_size=size,
        chunk_sizes=even_split(count, total),
        steps=_steps(moves),
    )


def allreduce(world_size: int, count: int, chunks: int | None = None) -> Schedule:
    """Binary tree allreduce of ``count`` elements over ``world_size`` ranks.

    Args:
        world_size: the number of ranks.
        count: elements in each rank's buffer.
        chunks: the pipelining depth, chunks the buffer is cut into;
            :func:`pipeline_chunks` of ``count`` when ``None``.
    """
    return trees_allreduce([binary_tree(world_size)], count, chunks, "allreduce-tree")


def _sent_per_element(tree: Tree, rank: int) -> int:
    return len(tree.children[rank]) + (rank != tree.root)


def trees_cost(collective: str, trees: Sequence[Tree], shares: Sequence[int], chunks: int | None) -> Cost:
    """Steps and elements sent per rank by :func:`trees_allreduce`, from the tables above.

    Args:
        collective: ``allreduce``.
        trees: the trees, as given to :func:`trees_allreduce`.
        shares: the buffer as the ring shares it; only the sum, the count, matters.
        chunks: the pipelining depth, as given to :func:`trees_allreduce`.
    """
    if collective != "allreduce":
        raise ValueError(f"the tree has no {collective!r}")
    count = sum(shares)
    total = _check_chunks(chunks, count)
    sizes = even_split(count, total)
    carried = _tree_chunks(total, len(trees))
    if trees[0].world_size == 1:
        return Cost(0, (0,))
    steps = max(len(mine) + 2 * tree.height - 1 for tree, mine in zip(trees, carried, strict=True) if mine)
    sent = tuple(
        sum(
            sum(sizes[c] for c in mine) * _sent_per_element(tree, rank)
            for tree, mine in zip(trees, carried, strict=True)
        )
        for rank in range(trees[0].world_size)
    )
    return Cost(steps, sent)


def cost(collective: str, shares: Sequence[int], chunks: int | None = None) -> Cost:
    """Steps and elements sent per rank by the binary tree, from the tables above.

    Args:
        collective: ``allreduce``.
        shares: the buffer split over ``len(shares)`` ranks, as for ``ring.cost``.
        chunks: the pipelining depth, as for :func:`allreduce`.
    """
    return trees_cost(collective, [binary_tree(len(shares))], shares, chunks)


# --- one rank's part, from its place in the trees alone


@dataclass(frozen=True)
class Place:
    """A rank's neighbourhood in a tree: what its part of the schedule depends on.

    Attributes:
        rank: the rank.
        parent: its parent; ``None`` for the root.
        children: its children, in the order they are reduced.
        depth: its distance from the root.
        parent_children: how many children its parent has (0 for the root).
    """

    rank: int
    parent: int | None
    children: tuple[int, ...]
    depth: int
    parent_children: int


def _in_order_place(world_size: int, rank: int) -> tuple[int | None, tuple[int, ...], int, int]:
    """``(parent, children, depth, parent's children)`` of ``rank`` in the in-order tree, in O(log P).

    Walks :func:`_in_order_tree`'s recursion from the top down to the rank's key.
    """

    def top(lo: int, hi: int) -> int:
        return hi & -(1 << (((lo - 1) ^ hi).bit_length() - 1))

    def below(lo: int, key: int, hi: int) -> tuple[int, ...]:
        return tuple(top(a, b) - 1 for a, b in ((lo, key - 1), (key + 1, hi)) if a <= b)

    target = rank + 1
    lo, hi, parent, parent_children, depth = 1, world_size, None, 0, 0
    while True:
        key = top(lo, hi)
        if key == target:
            return parent, below(lo, key, hi), depth, parent_children
        parent, parent_children, depth = key - 1, len(below(lo, key, hi)), depth + 1
        lo, hi = (lo, key - 1) if target < key else (key + 1, hi)


def relabelled_place(world_size: int, rank: int, second: bool) -> Place:
    """``rank``'s place in :func:`double_binary_tree`'s first tree, or its second (root ``None``)."""
    size = world_size
    if not second:
        parent, children, depth, parent_children = _in_order_place(size, rank)
        return Place(rank, parent, children, depth, parent_children)

    # the second tree is the first with rank q renamed to_second(q): mirrored for even P, shifted for odd
    def to_second(q: int) -> int:
        return size - 1 - q if size % 2 == 0 else (q + 1) % size

    first = size - 1 - rank if size % 2 == 0 else (rank - 1) % size
    parent, children, depth, parent_children = _in_order_place(size, first)
    return Place(
        rank,
        None if parent is None else to_second(parent),
        tuple(to_second(c) for c in children),
        depth,
        parent_children,
    )


def _height(world_size: int) -> int:
    # the in-order tree's depth, floor(log2 P) (see the module docstring)
    return world_size.bit_length() - 1


def trees_rank_program(
    places: Sequence[Place], world_size: int, count: int, chunks: int | None, name: str
) -> RankProgram:
    """One rank's part of :func:`trees_allreduce`, from its places in the trees (one per tree).

    A move of :func:`_allreduce_moves` involving the rank is one to or from its
    parent or children, and its step follows from the depths: in a tree of
    height h carrying the chunks ``mine``, the j-th leaves the rank for its
    parent at step ``j + h - depth``, arrives from its children at
    ``j + h - depth - 1``, goes down to its children at ``h + j + depth`` and
    arrives from its parent at ``h + j + depth - 1``.
    """
    total = _check_chunks(chunks, count)
    carried = _tree_chunks(total, len(places))
    height = _height(world_size)
    last = max((len(mine) + 2 * height - 1 for mine in carried if mine), default=0) if world_size > 1 else 0
    sends: list[list[Transfer]] = [[] for _ in range(last)]
    recvs: list[list[Transfer]] = [[] for _ in range(last)]
    crowded: set[tuple[int, int]] = set()
    for place, mine in zip(places, carried, strict=True):
        rank, parent, depth = place.rank, place.parent, place.depth
        if world_size == 1:
            break
        # the global listing: a tree's reduce moves, then its broadcast moves, then the next tree's
        for j, chunk in enumerate(mine):
            if parent is not None:
                sends[j + height - depth].append(Transfer(rank, parent, chunk, reduce=True))
                if place.parent_children > 1:
                    crowded.add((j + height - depth, parent))
            for child in place.children:
                recvs[j + height - depth - 1].append(Transfer(child, rank, chunk, reduce=True))
        for j, chunk in enumerate(mine):
            for child in place.children:
                sends[height + j + depth].append(Transfer(rank, child, chunk))
            if parent is not None:
                recvs[height + j + depth - 1].append(Transfer(parent, rank, chunk))
    return RankProgram(
        name=f"{name}(n={world_size},chunks={total})",
        collective="allreduce",
        world_size=world_size,
        rank=places[0].rank,
        chunk_sizes=even_split(count, total),
        steps=tuple(RankStep(tuple(s), tuple(r)) for s, r in zip(sends, recvs, strict=True)),
        crowded=frozenset(crowded),
    )


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part of the binary tree allreduce, from its place in the tree (see ``base``)."""
    if collective != "allreduce":
        return None
    size = len(shares)
    return trees_rank_program(
        [relabelled_place(size, rank, False)], size, sum(shares), None, "allreduce-tree"
    )


def trees_traffic(trees: Sequence[Tree], count: int, chunks: int | None, name: str) -> tuple[str, Traffic]:
    """The name and counted traffic of :func:`trees_allreduce`, from one rank of each kind.

    A rank's part depends on its depth and numbers of children in each tree and
    whether it has a parent, not on its number, so the busiest rank of every step
    is among one rank of each such kind: a few dozen at any P, counted step by step.
    """
    size = trees[0].world_size
    total = _check_chunks(chunks, count)
    kinds: dict[tuple[tuple[int, int, bool], ...], int] = {}
    for rank in range(size):
        kind = tuple((t.depth[rank], len(t.children[rank]), t.parent[rank] is None) for t in trees)
        kinds.setdefault(kind, rank)
    parts = [
        trees_rank_program(
            [
                Place(r, t.parent[r], t.children[r], t.depth[r], 0 if t.parent[r] is None else 2)
                for t in trees
            ],
            size,
            count,
            total,
            name,
        )
        for r in kinds.values()
    ]
    return f"{name}(n={size},chunks={total})", _counted_from(parts)


def _counted_from(parts: Sequence[RankProgram]) -> Traffic:
    """:func:`collectives.topology.cost_model.traffic` over the ranks of ``parts`` only.

    Exact when they include the busiest rank of every step.
    """
    sizes = parts[0].chunk_sizes
    steps = messages = elements = reduced = 0
    for index in range(len(parts[0].steps)):
        most = (0, 0, 0)
        for part in parts:
            step = part.steps[index]
            sent = [sizes[t.chunk] for t in step.sends if sizes[t.chunk]]
            got = [(sizes[t.chunk], t.reduce) for t in step.recvs if sizes[t.chunk]]
            mine = (
                max(len(sent), len(got)),
                max(sum(sent), sum(n for n, _ in got)),
                sum(n for n, r in got if r),
            )
            most = (max(most[0], mine[0]), max(most[1], mine[1]), max(most[2], mine[2]))
        if most[1]:
            steps, messages = steps + 1, messages + most[0]
            elements, reduced = elements + most[1], reduced + most[2]
    return Traffic(steps, messages, elements, reduced)


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The binary tree allreduce's name and counted traffic, from one rank of each kind (see ``base``)."""
    if collective != "allreduce":
        return None
    return trees_traffic([binary_tree(world_size)], count, None, "allreduce-tree")
