"""Shared-memory collectives on one node: each share reduced once, by its owner; rooted ones through the root.

The buffer is cut into one chunk per rank. In reduce-scatter every rank sends
chunk ``c`` straight to rank ``c``, which reduces all P contributions in rank
order; all-gather is every owner sending its chunk to every other rank; allreduce
is the one then the other. As a schedule this is what any transport can run. On
ranks that share one node it is run by :mod:`collectives.execute_shared`
instead, which does the same data movement without messages: each rank copies
its input into its region of a shared window once, each owner reduces its share
reading all P regions in one pass, and every rank copies the shares out. So the
selector is told the traffic of that execution (see :func:`traffic`), and the
algorithm is a candidate only where memory is shared (:data:`REQUIRES`).

The rooted collectives and the barrier are one step each. Broadcast: the root
copies its buffer into its region, every rank passes a barrier, the others copy
it out (as messages: the root sends to every other rank). Reduce: every other
rank copies its buffer into its region, a barrier, and the root combines all P
in rank order (every other rank sends to the root). Barrier: the barrier the
ranks agree on the call's signature through is the whole call (every rank
signals every other).

Across nodes it composes as the hierarchical algorithm does: reduce-scatter
inside each node through shared memory, rings between nodes on each rank's
share, all-gather inside each node (:mod:`.hierarchical_shared_memory`).

Cost, for P ranks and a buffer of S elements whose share at rank r is S_r:

==============  =====  =========================
collective      steps  elements sent by rank r
==============  =====  =========================
reduce_scatter  1      S - S_r
allgather       1      (P - 1) S_r
allreduce       2      S - S_r + (P - 1) S_r
broadcast       1      (P - 1) S at the root, else 0
reduce          1      S, and 0 at the root
barrier         1      P - 1 tokens
==============  =====  =========================
"""

__all__ = [
    "COMPILED",
    "COMPILED_SMALL_READ_ELEMENTS",
    "OVERSUBSCRIBED",
    "OVERSUBSCRIBED_SEGMENT_ELEMENTS",
    "REQUIRES",
    "REQUIRES_TEXT",
    "SEGMENT_ELEMENTS",
    "SMALL_ELEMENTS",
    "allgather",
    "allreduce",
    "barrier",
    "broadcast",
    "cost",
    "rank_program",
    "reduce",
    "reduce_scatter",
    "traffic",
]

from collections.abc import Sequence

from ..chunking import even_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer, share_schedule
from .base import Cost

REQUIRES = "shared_memory"
"""The transport feature this algorithm needs to be chosen by the selector."""

REQUIRES_TEXT = "ranks on one node"
"""How the selector says what is missing."""

SEGMENT_ELEMENTS = 1 << 17
"""float32 elements of each share per segment of the executor (its ``SEGMENT_BYTES``)."""

OVERSUBSCRIBED_SEGMENT_ELEMENTS = 1 << 16
"""The same where the transport's features say ``oversubscribed`` (``OVERSUBSCRIBED_SEGMENT_BYTES``)."""

OVERSUBSCRIBED_ROOTED_SEGMENT_ELEMENTS = 1 << 18
"""A broadcast's or reduce's there (``OVERSUBSCRIBED_ROOTED_SEGMENT_BYTES``)."""

SMALL_ELEMENTS = 1 << 17
"""float32 elements of all ranks' inputs together up to which an allreduce passes one barrier.

The executor's ``SMALL_TOTAL_BYTES``: each rank copies its input in and reduces the whole buffer.
"""

COMPILED_SMALL_READ_ELEMENTS = 1 << 19
"""With the ``compiled`` feature (the compiled engine reduces), an allreduce passes one barrier while the
float32 elements its ranks read in all, each every rank's input (``P * P`` times one input's), are at
most this (the executor's ``COMPILED_SMALL_READ_BYTES``)."""

COMPILED = "compiled"
"""The feature of shared memory whose repeated calls the compiled engine runs."""

OVERSUBSCRIBED = "oversubscribed"
"""The feature of a node whose ranks outnumber its cores."""


def _scatter(size: int) -> Step:
    return Step(Transfer(r, c, c, reduce=True) for c in range(size) for r in range(size) if r != c)


def _gather(size: int) -> Step:
    return Step(Transfer(c, r, c) for c in range(size) for r in range(size) if r != c)


def reduce_scatter(shares: Sequence[int]) -> Schedule:
    """Every rank's share reduced at its owner in one step."""
    size = len(shares)
    return share_schedule("reduce_scatter", "shared_memory", shares, (_scatter(size),) if size > 1 else ())


def allgather(shares: Sequence[int]) -> Schedule:
    """Every owner's share copied to every other rank in one step."""
    size = len(shares)
    return share_schedule("allgather", "shared_memory", shares, (_gather(size),) if size > 1 else ())


def allreduce(world_size: int, count: int) -> Schedule:
    """Reduce-scatter then all-gather, one step each."""
    steps = (_scatter(world_size), _gather(world_size)) if world_size > 1 else ()
    return Schedule.named("allreduce", "shared_memory", world_size, even_split(count, world_size), steps)


def _from_root(world_size: int, root: int) -> Step:
    return Step(Transfer(root, r, 0) for r in range(world_size) if r != root)


def _to_root(world_size: int, root: int) -> Step:
    return Step(Transfer(r, root, 0, reduce=True) for r in range(world_size) if r != root)


def broadcast(world_size: int, count: int, root: int) -> Schedule:
    """The root's buffer copied out by every other rank in one step."""
    steps = (_from_root(world_size, root),) if world_size > 1 else ()
    return Schedule.named("broadcast", "shared_memory", world_size, (count,), steps, root=root)


def reduce(world_size: int, count: int, root: int) -> Schedule:
    """Every other rank's buffer combined at the root in one step."""
    steps = (_to_root(world_size, root),) if world_size > 1 else ()
    return Schedule.named("reduce", "shared_memory", world_size, (count,), steps, root=root)


def barrier(world_size: int) -> Schedule:
    """Every rank signals every other in one step (a token each)."""
    ranks = range(world_size)
    signals = Step(Transfer(r, c, 0, reduce=True) for c in ranks for r in ranks if r != c)
    return Schedule.named("barrier", "shared_memory", world_size, (1,), (signals,) if world_size > 1 else ())


def cost(collective: str, shares: Sequence[int], root: int = 0) -> Cost:
    """Steps and elements sent per rank, from the table above."""
    size = len(shares)
    total = sum(shares)
    if size == 1:
        return Cost(0, (0,))
    if collective == "broadcast":
        return Cost(1, tuple((size - 1) * total if r == root else 0 for r in range(size)))
    if collective == "reduce":
        return Cost(1, tuple(0 if r == root else total for r in range(size)))
    if collective == "barrier":
        return Cost(1, (size - 1,) * size)
    if collective == "reduce_scatter":
        return Cost(1, tuple(total - s for s in shares))
    if collective == "allgather":
        return Cost(1, tuple((size - 1) * s for s in shares))
    return Cost(2, tuple(total - s + (size - 1) * s for s in shares))


def traffic(
    collective: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> tuple[int, int, int, int, int, int]:
    """``(steps, messages, elements, reduced, barriers, copied)`` of the shared-memory execution.

    What the cost model weighs (see :class:`collectives.topology.cost_model.Traffic`). It sends
    no messages; it copies through shared memory and synchronises by barriers. Per
    segment of :data:`SEGMENT_ELEMENTS` of every share (float32 elements taken;
    :data:`OVERSUBSCRIBED_SEGMENT_ELEMENTS` with the ``oversubscribed`` feature),
    an allreduce passes two barriers, the other collectives one; an allreduce whose
    inputs together are at most :data:`SMALL_ELEMENTS` (with the ``compiled`` feature: whose ranks
    read at most :data:`COMPILED_SMALL_READ_ELEMENTS` in all) passes one in all
    (each rank copies its input in and reduces the whole buffer). An allreduce's first barrier
    is not counted: it carries the call's signature, and every call on memory the ranks share
    passes one barrier to agree on it, whatever the algorithm (see ``Watchdog.agree_through``).
    Copied: an allreduce copies in the other owners' parts of
    its input, the other owners' shares out and its own share into its result slot (a result's
    worth); reduce-scatter the other owners'
    parts; all-gather its own share in and the other shares out (its own share's copy into the
    result every algorithm makes, so it is not counted; counted, it made a 2-rank all-gather
    from 256 KiB look slower than ring, which it is not: 38 against 69 us at 400 KB). Reduced: an owner's
    share read from P - 1 other ranks. ``features`` are the transport's.

    The rooted collectives go through the window in segments of the whole buffer, one barrier
    each (the first carries the signature, as an allreduce's): a broadcast's root copies in
    and the others copy out, a reduce's others copy in and the root reduces P parts; the
    copies of one segment overlap the next segment's, so only the first segment's copy in
    adds to the path. The barrier is the signature's barrier alone: nothing besides the call.
    """
    if world_size == 1 or count == 0 or collective == "barrier":
        return (0, 0, 0, 0, 0, 0)
    crowded = OVERSUBSCRIBED in features
    if collective in ("broadcast", "reduce"):
        per_segment = OVERSUBSCRIBED_ROOTED_SEGMENT_ELEMENTS if crowded else SEGMENT_ELEMENTS
        segments, first = -(-count // per_segment), min(count, per_segment)
        if collective == "broadcast":
            return (segments, 0, 0, 0, segments - 1, first + count)
        return (segments, 0, 0, (world_size - 1) * count, segments - 1, first)
    per_segment = OVERSUBSCRIBED_SEGMENT_ELEMENTS if crowded else SEGMENT_ELEMENTS
    share = -(-count // world_size)
    segments = -(-share // per_segment)
    others = (world_size - 1) * share
    if collective == "allreduce":
        if (
            count <= COMPILED_SMALL_READ_ELEMENTS // (world_size * world_size)
            if COMPILED in features
            else count * world_size <= SMALL_ELEMENTS
        ):
            return (1, 0, 0, (world_size - 1) * count, 0, count)
        return (2 * segments, 0, 0, others, 2 * segments - 1, others + count)
    if collective == "reduce_scatter":
        return (segments, 0, 0, others, segments, others)
    return (segments, 0, 0, 0, segments, share + others)


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part: one transfer each way with every other rank a step (see ``base``)."""
    size = len(shares)
    others = [r for r in range(size) if r != rank]
    scatter = RankStep(
        tuple(Transfer(rank, c, c, reduce=True) for c in others),
        tuple(Transfer(r, rank, rank, reduce=True) for r in others),
    )
    gather = RankStep(
        tuple(Transfer(rank, r, rank) for r in others), tuple(Transfer(c, rank, c) for c in others)
    )
    chosen = {"reduce_scatter": (scatter,), "allgather": (gather,), "allreduce": (scatter, gather)}
    if collective in ("broadcast", "reduce", "barrier"):
        return _rooted_program(collective, size, sum(shares), root, rank)
    if collective not in chosen:
        return None
    crowded = frozenset((0, c) for c in others) if collective != "allgather" and size > 2 else frozenset()
    if collective == "allreduce":
        chunks, owner = even_split(sum(shares), size), None
    else:
        chunks, owner = shares, range(size)
    steps = chosen[collective] if size > 1 else ()
    return RankProgram.named(
        collective, "shared_memory", size, chunks, steps, rank=rank, chunk_owner=owner, crowded=crowded
    )


def _rooted_program(collective: str, size: int, count: int, root: int | None, rank: int) -> RankProgram:
    """Rank ``rank``'s part of a broadcast, reduce or barrier: one step, with the root or with every rank."""
    others = [r for r in range(size) if r != rank]
    if collective == "barrier":
        step = RankStep(
            tuple(Transfer(rank, c, 0, reduce=True) for c in others),
            tuple(Transfer(r, rank, 0, reduce=True) for r in others),
        )
        crowded = frozenset((0, c) for c in others) if size > 2 else frozenset()
        steps = (step,) if size > 1 else ()
        return RankProgram.named("barrier", "shared_memory", size, (1,), steps, rank=rank, crowded=crowded)
    assert root is not None  # a rooted collective has its root
    schedule_step = _from_root(size, root) if collective == "broadcast" else _to_root(size, root)
    mine = schedule_step.transfers
    step = RankStep(tuple(t for t in mine if t.src == rank), tuple(t for t in mine if t.dst == rank))
    crowded = frozenset({(0, root)}) if collective == "reduce" and size > 2 and rank != root else frozenset()
    return RankProgram.named(
        collective, "shared_memory", size, (count,), (step,) if size > 1 else (), rank=rank, root=root,
        crowded=crowded,
    )  # fmt: skip
