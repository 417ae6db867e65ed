"""Reduce-scatter, all-gather and allreduce over several rings at once, the buffer split between them.

Each ring is an order of all the ranks, and the rings run side by side, step
for step, each a ring algorithm (see :mod:`collectives.algorithms.ring`) on
its own part of the buffer: rank r's share is cut into one chunk per ring,
in proportion to the rings' weights, and ring i moves only the i-th chunk of
every share. Rings that use different links, such as the double-NVLink and
the single-NVLink rings of a DGX-1 (weights 2:1, see
:func:`collectives.topology.pack_rings`), add up their bandwidths. Running a
ring both ways (``bidirectional``) adds its reverse with the same weight: the
reverse uses the other direction of every link, so on full-duplex links it
halves the time of the bandwidth term. Without rings, the default is the
bidirectional ring: ranks in order, and the same reversed.

Cost, for P ranks, rings with next_i(r) the rank after r on ring i, and a
buffer of S elements whose share at rank r is S_r, cut into s_(r,i) for ring i:

=================  ============  ============================================
collective         steps         elements sent by rank r
=================  ============  ============================================
reduce_scatter     P - 1         S - S_r
allgather          P - 1         S - sum_i s_(next_i(r), i)
allreduce          2 (P - 1)     2 S - S_r - sum_i s_(next_i(r), i)
=================  ============  ============================================

as for one ring, but every step sends one message per ring. Allreduce shares
the buffer evenly (the first S mod P shares one element larger), then splits
each share between the rings; so with one ring it is the ring allreduce.
"""

__all__ = [
    "DEFAULT_RINGS",
    "allgather",
    "allreduce",
    "cost",
    "for_topology",
    "rank_program",
    "reduce_scatter",
    "schedule_traffic",
]

from collections.abc import Sequence

from ..chunking import even_split, weighted_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer
from ..topology import Topology, Traffic, pack_rings
from .base import Cost

DEFAULT_RINGS = "ranks in order, and reversed"
"""What ``rings=None`` means."""

_Rings = tuple[tuple[int, ...], ...]


def reduce_scatter(
    shares: Sequence[int],
    rings: Sequence[Sequence[int]] | None = None,
    weights: Sequence[float] | None = None,
    bidirectional: bool = False,
) -> Schedule:
    """Reduce-scatter on several rings; rank ``r`` ends with its share of ``shares[r]`` elements reduced.

    Args:
        shares: elements of each rank's share.
        rings: orders of all the ranks, one per ring; the bidirectional ring by default.
        weights: how the rings split every share, positive; equal by default.
        bidirectional: also run every ring the other way round, with its weight.
    """
    plan = _Plan(len(shares), rings, weights, bidirectional)
    return plan.schedule("reduce_scatter", shares, plan.reduce_scatter_steps(), owned=True)


def allgather(
    shares: Sequence[int],
    rings: Sequence[Sequence[int]] | None = None,
    weights: Sequence[float] | None = None,
    bidirectional: bool = False,
) -> Schedule:
    """All-gather on several rings; rank ``r`` contributes ``shares[r]`` elements and ends with them all.

    Args as for :func:`reduce_scatter`.
    """
    plan = _Plan(len(shares), rings, weights, bidirectional)
    return plan.schedule("allgather", shares, plan.allgather_steps(), owned=True)


def allreduce(
    world_size: int,
    count: int,
    rings: Sequence[Sequence[int]] | None = None,
    weights: Sequence[float] | None = None,
    bidirectional: bool = False,
) -> Schedule:
    """Allreduce of ``count`` elements over ``world_size`` ranks on several rings.

    Args as for :func:`reduce_scatter`.
    """
    plan = _Plan(world_size, rings, weights, bidirectional)
    steps = (*plan.reduce_scatter_steps(), *plan.allgather_steps())
    return plan.schedule("allreduce", even_split(count, world_size), steps, owned=False)


def for_topology(collective: str, world_size: int, count: int, topology: Topology) -> Schedule | None:
    """The schedule on ``topology``'s packed rings, run both ways, rank r on GPU r.

    ``None`` when the rings cannot be packed for one GPU per rank, or for a
    collective this module lacks; the selector then builds the default rings.
    """
    packing = pack_rings(topology)
    if not packing.rings or len(topology.gpus) != world_size:
        return None
    rings, weights = packing.rank_rings(topology.gpus), packing.bandwidths
    if collective == "allreduce":
        return allreduce(world_size, count, rings, weights, bidirectional=True)
    if collective in ("reduce_scatter", "allgather"):
        builder = reduce_scatter if collective == "reduce_scatter" else allgather
        return builder(even_split(count, world_size), rings, weights, bidirectional=True)
    return None


def cost(
    collective: str,
    shares: Sequence[int],
    rings: Sequence[Sequence[int]] | None = None,
    weights: Sequence[float] | None = None,
    bidirectional: bool = False,
) -> Cost:
    """Steps and elements sent per rank, from the table above (``shares`` as the shares)."""
    plan = _Plan(len(shares), rings, weights, bidirectional)
    size = len(shares)
    total = sum(shares)
    parts = [weighted_split(share, plan.weights) for share in shares]
    nexts = [{ring[p]: ring[(p + 1) % size] for p in range(size)} for ring in plan.rings]
    gathered = tuple(total - sum(parts[nexts[i][r]][i] for i in range(len(nexts))) for r in range(size))
    if collective == "reduce_scatter":
        return Cost(size - 1, tuple(total - shares[r] for r in range(size)))
    if collective == "allgather":
        return Cost(size - 1, gathered)
    if collective == "allreduce":
        return Cost(2 * (size - 1), tuple(total - shares[r] + gathered[r] for r in range(size)))
    raise ValueError(f"the multi-ring has no {collective!r}")


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part on the default rings, from its neighbours on each (see ``base``)."""
    size = len(shares)
    if collective not in ("reduce_scatter", "allgather", "allreduce"):
        return None
    plan = _Plan(size, None, None, False)
    # the default rings are the ranks in order and reversed: rank r sits at place r, then P - 1 - r
    places = [rank, size - 1 - rank]

    def part(offset: int, reduce: bool) -> list[RankStep]:
        n = size
        return [
            RankStep(
                tuple(
                    Transfer(rank, ring[(p + 1) % n], plan.chunk(ring[(p - s - offset) % n], i), reduce)
                    for i, (ring, p) in enumerate(zip(plan.rings, places, strict=True))
                ),
                tuple(
                    Transfer(ring[(p - 1) % n], rank, plan.chunk(ring[(p - 1 - s - offset) % n], i), reduce)
                    for i, (ring, p) in enumerate(zip(plan.rings, places, strict=True))
                ),
            )
            for s in range(n - 1)
        ]

    phases = {"reduce_scatter": [(1, True)], "allgather": [(0, False)], "allreduce": [(1, True), (0, False)]}
    steps = tuple(step for offset, reduce in phases[collective] for step in part(offset, reduce))
    layout = even_split(sum(shares), size) if collective == "allreduce" else shares
    # each neighbour reduces from both of its own on the two rings in a reducing step
    reducing = range(size - 1) if collective != "allgather" and size > 2 else range(0)
    crowded = frozenset((s, peer) for s in reducing for peer in ((rank + 1) % size, (rank - 1) % size))
    return RankProgram(
        name=f"{collective}-multi_ring(n={size})",
        collective=collective,
        world_size=size,
        rank=rank,
        chunk_sizes=tuple(half for share in layout for half in weighted_split(share, plan.weights)),
        steps=steps,
        chunk_owner=None if collective == "allreduce" else tuple(r for r in range(size) for _ in range(2)),
        crowded=crowded,
    )


def _overlap(inside: int, size: int, shift: int) -> int:
    """How many a in 0..inside-1 have (a + shift) mod size in 0..inside-1 too."""
    return max(0, inside - shift) + max(0, inside + shift - size)


def _most(first: tuple[int, int], second: tuple[int, int], larger: int, size: int, shift: int) -> int:
    """The most ``first[a in] + second[b in]`` over ranks, b = a + shift mod P, the first ``larger`` in."""
    inside = _overlap(larger, size, shift)
    counts = {
        (0, 0): inside,
        (0, 1): larger - inside,
        (1, 0): larger - inside,
        (1, 1): size - 2 * larger + inside,
    }
    return max(first[x] + second[y] for (x, y), n in counts.items() if n > 0)


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The default bidirectional ring's name and counted traffic, by formula (see ``base``).

    At step s rank r sends the first half of share ``r - s - offset`` on the
    forward ring and the second half of share ``r + s + offset`` on the reverse
    one: two shares ``2 s + 2 offset`` apart, whose sizes depend only on whether
    each is one of the ``count mod P`` larger shares, so the busiest rank of a
    step is found from how many ranks have each of the four combinations.
    """
    size = world_size
    phases = {"reduce_scatter": [(1, True)], "allgather": [(0, False)], "allreduce": [(1, True), (0, False)]}
    if collective not in phases:
        return None
    name = f"{collective}-multi_ring(n={size})"
    if size == 1 or count == 0:
        return name, Traffic(0, 0, 0, 0)
    small, larger = divmod(count, size)
    big = small + 1
    first = (-(-big // 2), -(-small // 2))  # index 0: a larger share, 1: a smaller
    second = (big // 2, small // 2)
    nonzero = ((int(first[0] > 0), int(first[1] > 0)), (int(second[0] > 0), int(second[1] > 0)))
    steps = messages = elements = reduced = 0
    for offset, reduce in phases[collective]:
        for s in range(size - 1):
            # sent: shares r - s - offset and r + s + offset; received: one further on each ring
            shifts = ((2 * s + 2 * offset) % size, (2 * s + 2 * offset + 2) % size)
            most = max(_most(first, second, larger, size, shift) for shift in shifts)
            if not most:
                continue
            steps += 1
            messages += max(_most(*nonzero, larger, size, shift) for shift in shifts)
            elements += most
            reduced += _most(first, second, larger, size, shifts[1]) if reduce else 0
    return name, Traffic(steps, messages, elements, reduced)


class _Plan:
    """The rings and weights of one schedule, checked, and the steps they make."""

    def __init__(
        self,
        world_size: int,
        rings: Sequence[Sequence[int]] | None,
        weights: Sequence[float] | None,
        bidirectional: bool,
    ) -> None:
        if world_size < 1:
            raise ValueError(f"world size must be at least 1, got {world_size}")
        self.size = world_size
        if rings is None:
            rings, bidirectional = [tuple(range(world_size))], True
        chosen = tuple(tuple(ring) for ring in rings)
        if not chosen:
            raise ValueError("need at least one ring")
        for ring in chosen:
            if sorted(ring) != list(range(world_size)):
                raise ValueError(f"ring {ring} is not an order of ranks 0..{world_size - 1}")
        scale = tuple(1.0 for _ in chosen) if weights is None else tuple(weights)
        if len(scale) != len(chosen):
            raise ValueError(f"{len(scale)} weights for {len(chosen)} rings")
        weighted_split(0, scale)  # positive and finite
        if bidirectional:
            chosen = tuple(r for ring in chosen for r in (ring, ring[::-1]))
            scale = tuple(w for w in scale for _ in range(2))
        self.rings: _Rings = chosen
        self.weights = scale
        natural = tuple(range(world_size))
        self.default = chosen == (natural, natural[::-1]) and scale[0] == scale[1]

    def chunk(self, rank: int, ring: int) -> int:
        """The chunk of ``rank``'s share that ``ring`` moves; chunks are in rank order."""
        return rank * len(self.rings) + ring

    def reduce_scatter_steps(self) -> list[Step]:
        # on each ring, at step s the rank at position p passes on the chunk of
        # position p - s - 1, the one it reduced last step, as the ring does
        n = self.size
        return [
            Step(
                Transfer(ring[p], ring[(p + 1) % n], self.chunk(ring[(p - s - 1) % n], i), reduce=True)
                for i, ring in enumerate(self.rings)
                for p in range(n)
            )
            for s in range(n - 1)
        ]

    def allgather_steps(self) -> list[Step]:
        n = self.size
        return [
            Step(
                Transfer(ring[p], ring[(p + 1) % n], self.chunk(ring[(p - s) % n], i))
                for i, ring in enumerate(self.rings)
                for p in range(n)
            )
            for s in range(n - 1)
        ]

    def schedule(
        self, collective: str, shares: Sequence[int], steps: Sequence[Step], owned: bool
    ) -> Schedule:
        k = len(self.rings)
        return Schedule(
            name=f"{collective}-multi_ring({self._parameters()})",
            collective=collective,
            world_size=self.size,
            chunk_sizes=tuple(part for share in shares for part in weighted_split(share, self.weights)),
            steps=tuple(steps),
            chunk_owner=tuple(r for r in range(self.size) for _ in range(k)) if owned else None,
        )

    def _parameters(self) -> str:
        if self.default:
            return f"n={self.size}"
        least = min(self.weights)
        rings = ",".join(
            "-".join(map(str, ring)) + f":{w / least:g}"
            for ring, w in zip(self.rings, self.weights, strict=True)
        )
        return f"n={self.size},rings={rings}"
