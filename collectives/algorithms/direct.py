"""Direct algorithms: a star round one rank, and pairwise exchange for alltoall.

Every transfer goes straight to where its data is needed, in as few steps as the
collective allows. The rooted collectives are one step: the root sends to every
other rank (broadcast, scatter) or every other rank sends to the root (reduce,
gather), the root combining what it receives in rank order. The others are the
parameter-server pattern round rank 0, the hub: everything goes to the hub,
which reduces it, and back out (allreduce is reduce then broadcast,
reduce_scatter is reduce then scatter, allgather is gather then broadcast of the
shares each rank lacks); the barrier is the same with one-element tokens. The
star's centre carries all the traffic and, when reducing, receives P - 1 buffers
at once (scratch for them all), so the star suits small buffers and few ranks;
its virtue is the fewest steps. Alltoall is pairwise exchange: at step s rank i
sends its share for rank i + s and receives rank i - s's share for it (mod P),
so every rank sends and receives one share per step and no rank is a hot spot.

Cost, for P ranks, a buffer of S elements whose share at rank r is S_r, and
root R (rank 0 for the collectives without a root); no steps when P = 1:

==============  =====  ==================  ===========================
collective      steps  elements sent by R  elements sent by rank r != R
==============  =====  ==================  ===========================
broadcast       1      (P - 1) S           0
reduce          1      0                   S
gather          1      0                   S_r
scatter         1      S - S_R             0
allreduce       2      (P - 1) S           S
reduce_scatter  2      S - S_R             S
allgather       2      (P - 2) S + S_R     S_r
barrier         2      P - 1               1
alltoall        P - 1  S - S / P           S - S / P
==============  =====  ==================  ===========================

For alltoall S is what each rank sends in all, P shares of S / P elements, and
the buffer holds an input and an output half (see ``collectives.specs``). The
barrier's elements are one-element tokens.
"""

__all__ = [
    "allgather",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "cost",
    "gather",
    "rank_program",
    "reduce",
    "reduce_scatter",
    "scatter",
    "schedule_traffic",
]

from collections.abc import Callable, Iterable, Sequence

from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer, schedule_name, share_schedule
from ..specs import get_spec
from ..topology.cost_model import Traffic
from .base import Cost

HUB = 0
"""The star's centre for the collectives that have no root."""


def _steps(*steps: Iterable[Transfer]) -> tuple[Step, ...]:
    """The steps that have transfers: a world of one rank has none."""
    built = (Step(transfers) for transfers in steps)
    return tuple(step for step in built if step.transfers)


def _others(world_size: int, rank: int) -> list[int]:
    return [r for r in range(world_size) if r != rank]


def _to(root: int, world_size: int, chunks: Sequence[int], reduce: bool) -> list[Transfer]:
    """Every other rank sends ``chunks`` to ``root``, in rank order (the order the root combines them)."""
    return [Transfer(r, root, c, reduce=reduce) for r in _others(world_size, root) for c in chunks]


def _from(root: int, world_size: int, chunks: Sequence[int]) -> list[Transfer]:
    """``root`` sends ``chunks`` to every other rank."""
    return [Transfer(root, r, c) for r in _others(world_size, root) for c in chunks]


def broadcast(world_size: int, count: int, root: int) -> Schedule:
    """The root sends its ``count`` elements to every other rank."""
    steps = _steps(_from(root, world_size, [0]))
    return Schedule.named("broadcast", "direct", world_size, (count,), steps, root=root)


def reduce(world_size: int, count: int, root: int) -> Schedule:
    """Every other rank sends its ``count`` elements to the root, which combines them."""
    steps = _steps(_to(root, world_size, [0], reduce=True))
    return Schedule.named("reduce", "direct", world_size, (count,), steps, root=root)


def gather(shares: Sequence[int], root: int) -> Schedule:
    """Every other rank sends its share of ``shares[r]`` elements to the root."""
    size = len(shares)
    return share_schedule(
        "gather",
        "direct",
        shares,
        _steps(Transfer(r, root, r) for r in _others(size, root)),
        root,
    )


def scatter(shares: Sequence[int], root: int) -> Schedule:
    """The root sends rank ``r`` its share of ``shares[r]`` elements."""
    size = len(shares)
    return share_schedule(
        "scatter",
        "direct",
        shares,
        _steps(Transfer(root, r, r) for r in _others(size, root)),
        root,
    )


def allreduce(world_size: int, count: int) -> Schedule:
    """Reduce to the hub, then broadcast from it."""
    steps = _steps(_to(HUB, world_size, [0], reduce=True), _from(HUB, world_size, [0]))
    return Schedule.named("allreduce", "direct", world_size, (count,), steps)


def reduce_scatter(shares: Sequence[int]) -> Schedule:
    """Reduce the whole buffer at the hub, then send each rank its share."""
    size = len(shares)
    return share_schedule(
        "reduce_scatter",
        "direct",
        shares,
        _steps(
            _to(HUB, size, range(size), reduce=True),
            (Transfer(HUB, r, r) for r in _others(size, HUB)),
        ),
    )


def allgather(shares: Sequence[int]) -> Schedule:
    """Gather the shares at the hub, then send each rank the shares it lacks."""
    size = len(shares)
    return share_schedule(
        "allgather",
        "direct",
        shares,
        _steps(
            (Transfer(r, HUB, r) for r in _others(size, HUB)),
            (Transfer(HUB, r, c) for r in _others(size, HUB) for c in _others(size, r)),
        ),
    )


def barrier(world_size: int) -> Schedule:
    """Every rank signals the hub, which signals back once it has heard from all."""
    steps = _steps(_to(HUB, world_size, [0], reduce=True), _from(HUB, world_size, [0]))
    return Schedule.named("barrier", "direct", world_size, (1,), steps)


def alltoall(world_size: int, count: int) -> Schedule:
    """Pairwise exchange of ``count`` elements per rank, a share of ``count / P`` for each rank.

    Raises:
        ValueError: ``count`` is not divisible by ``world_size``.
    """
    size = world_size
    share, left = divmod(count, size)
    if left:
        raise ValueError(f"alltoall needs a count divisible by the world size {size}, got {count}")
    rounds = (
        [Transfer(i, (i + s) % size, (i + s) % size, dst_chunk=size + i) for i in range(size)]
        for s in range(1, size)
    )
    return Schedule.named("alltoall", "direct", size, (share,) * (2 * size), _steps(*rounds))


def cost(collective: str, shares: Sequence[int], root: int = 0) -> Cost:
    """Steps and elements sent per rank, from the table above.

    Args:
        collective: the collective's name.
        shares: each rank's share of the buffer; only their sum S matters to
            the collectives without chunk owners, and only their number P to the
            barrier. Alltoall's are its P equal shares, one for each rank.
        root: the root of a rooted collective; the others centre on rank 0.
    """
    size, total = len(shares), sum(shares)
    center = root if get_spec(collective).rooted else HUB
    if collective == "alltoall":
        return Cost(size - 1, tuple(total - shares[r] for r in range(size)))
    # (steps, elements sent by the centre, elements sent by rank r elsewhere)
    table: dict[str, tuple[int, int, Callable[[int], int]]] = {
        "broadcast": (1, (size - 1) * total, lambda r: 0),
        "reduce": (1, 0, lambda r: total),
        "gather": (1, 0, lambda r: shares[r]),
        "scatter": (1, total - shares[center], lambda r: 0),
        "allreduce": (2, (size - 1) * total, lambda r: total),
        "reduce_scatter": (2, total - shares[center], lambda r: total),
        "allgather": (2, (size - 2) * total + shares[center], lambda r: shares[r]),
        "barrier": (2, size - 1, lambda r: 1),
    }
    steps, at_center, elsewhere = table[collective]
    sent = tuple(at_center if r == center else elsewhere(r) for r in range(size))
    return Cost(steps if size > 1 else 0, sent)


def _part(rank: int, *steps: Sequence[Transfer]) -> tuple[RankStep, ...]:
    """``rank``'s part of the given steps' transfers, whose receives the caller lists in schedule order."""
    return tuple(
        RankStep(tuple(t for t in step if t.src == rank), tuple(t for t in step if t.dst == rank))
        for step in steps
    )


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part: only the centre's grows with P (see ``base``)."""
    size, count = len(shares), sum(shares)
    if size == 1:
        steps: tuple[RankStep, ...] = ()
    center = HUB if root is None else root
    # the transfers this rank takes part in, step by step, in the schedule's order
    peers = _others(size, center) if rank == center else [rank]
    owned: tuple[int, ...] | None = tuple(range(size))
    sizes: tuple[int, ...] = tuple(shares)
    crowded: frozenset[tuple[int, int]] = frozenset()
    if collective in ("allreduce", "barrier", "reduce", "broadcast"):
        into = [Transfer(r, center, 0, reduce=True) for r in peers]
        out = [Transfer(center, r, 0) for r in peers]
        chosen = {"allreduce": (into, out), "barrier": (into, out), "reduce": (into,), "broadcast": (out,)}
        parts = chosen[collective]
        owned, sizes = None, (1,) if collective == "barrier" else (count,)
        if collective != "broadcast" and size > 2 and rank != center:
            crowded = frozenset({(0, center)})
    elif collective in ("gather", "scatter"):
        parts = (
            [Transfer(r, center, r) if collective == "gather" else Transfer(center, r, r) for r in peers],
        )
    elif collective == "reduce_scatter":
        into = [Transfer(r, HUB, c, reduce=True) for r in peers for c in range(size)]
        parts = (into, [Transfer(HUB, r, r) for r in peers])
        if size > 2 and rank != HUB:
            crowded = frozenset({(0, HUB)})
    elif collective == "allgather":
        parts = (
            [Transfer(r, HUB, r) for r in peers],
            [Transfer(HUB, r, c) for r in peers for c in _others(size, r)],
        )
    elif collective == "alltoall":
        share = count // size
        steps = tuple(
            RankStep(
                (Transfer(rank, (rank + s) % size, (rank + s) % size, dst_chunk=size + rank),),
                (Transfer((rank - s) % size, rank, rank, dst_chunk=size + (rank - s) % size),),
            )
            for s in range(1, size)
        )
        parts, owned, sizes = (), None, (share,) * (2 * size)
    else:
        return None
    if parts:
        steps = _part(rank, *parts) if size > 1 else ()
    return RankProgram.named(
        collective, "direct", size, sizes, steps, rank=rank, root=root, chunk_owner=owned, crowded=crowded
    )


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The star's counted traffic where it is short to write (see ``base``): all at the centre."""
    others = world_size - 1
    name = schedule_name(collective, "direct", world_size, 0 if get_spec(collective).rooted else None)
    if collective == "barrier":
        count = 1
    if collective not in ("allreduce", "barrier", "reduce", "broadcast"):
        return None
    if others == 0 or count == 0:
        return name, Traffic(0, 0, 0, 0)
    # the centre receives (reducing) and sends one message of ``count`` from and to each other rank
    into, out = (1, others, others * count, others * count), (1, others, others * count, 0)
    both = {"reduce": (into,), "broadcast": (out,)}.get(collective, (into, out))
    return name, Traffic(*(sum(column) for column in zip(*both, strict=True)))
