"""Butterfly reduce-scatter, all-gather and allreduce: recursive halving and recursive doubling.

At the step of distance d (a power of two) rank r works with its peer r XOR d,
so after log2 P steps every rank has heard, through its peers, from every other.
Reduce-scatter halves (recursive halving): the first step's peers are P/2 apart
and each hands the other the half of the buffer that the other's half of the
ranks will own, reduced into the peer's copy; each later step halves the part a
rank is responsible for, until it holds its own share with every contribution.
All-gather runs the same steps backwards (recursive doubling): each rank sends
its peer everything it has gathered, doubling it, distance 1 first. Allreduce
exchanges and reduces the whole buffer at every step (recursive doubling), the
fewest steps of any allreduce but all S elements on the wire at each, so it
suits small messages; ``halving_doubling`` is the allreduce for large ones.

A world size that is not a power of two is folded: with P' the largest power of
two not above P and E = P - P', extra rank P' + i first hands its data to rank
i (reduced into it for reduce-scatter and allreduce), the P' ranks run the
butterfly with rank i also standing for rank P' + i (for reduce-scatter and
all-gather it handles chunks i and P' + i), and rank i finally sends rank
P' + i its result. That costs two steps and leaves the extra ranks idle.

Every element is reduced in one order by this module's allreduce and
reduce-scatter and by ``halving_doubling``'s allreduce: a_i + a_(P'+i) for the
folded ranks, then a balanced tree in which peers P'/2 apart meet first. Their
results are the same bits as one another, so choosing between them by size
does not change results, but generally not the ring's (they agree for P <= 2).
Every rank ends with the same bits: the reduce-scatter reduces each chunk at one
rank only, and in the allreduce ranks that have combined the same inputs hold
the same bits, since each step's sum is a + b on one rank and b + a on its peer,
which IEEE arithmetic rounds alike. The exception is NaN payloads: where two
different NaNs meet, a kernel keeps the one in a given operand position, so the
peers may end with NaNs of different bits. ``halving_doubling`` copies its
results and has no such exception.

Cost, for P ranks and a buffer of S elements whose share at rank r is S_r
(allreduce: S alone matters). P' = the largest power of two not above P,
E = P - P', m = log2 P' and f = 1 if E > 0 else 0; sums run over the distances
d = 1, 2, ..., P'/2. Rank v < P' handles W_v = S_v + S_(P'+v) if v < E,
else W_v = S_v, and W(r, d) is the sum of W_v over the d ranks v with
v // d == r // d (the aligned group of d ranks that holds r):

===============  ======  ==========================================  ===========
collective       steps   elements sent by rank r < P'                rank P' + i
===============  ======  ==========================================  ===========
reduce_scatter   m + 2f  sum_d W(r XOR d, d) + [r < E] S_(P'+r)      S
allgather        m + 2f  sum_d W(r, d) + [r < E] (S - S_(P'+r))      S_(P'+i)
allreduce        m + 2f  (m + [r < E]) S                             S
===============  ======  ==========================================  ===========

For a power of two P with even shares that is (P - 1) / P * S for reduce-scatter
and all-gather, as for the ring but in log2 P steps instead of P - 1, and
log2 P * S for allreduce.
"""

# beside the algorithm's interface, its building blocks, which halving_doubling.py shares
__all__ = [
    "aligned_group",
    "allgather",
    "allreduce",
    "butterfly_distances",
    "butterfly_traffic",
    "cost",
    "doubling_part",
    "doubling_steps",
    "fold_in_part",
    "fold_in_steps",
    "fold_out_part",
    "fold_out_steps",
    "fold_traffic",
    "halving_part",
    "halving_steps",
    "power_of_two_base",
    "rank_program",
    "reduce_scatter",
    "schedule_traffic",
    "total_traffic",
]

from collections.abc import Callable, Iterable, Sequence

from ..chunking import even_split
from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer, schedule_name, share_schedule
from ..topology.cost_model import Traffic
from .base import Cost


def power_of_two_base(world_size: int) -> int:
    """The largest power of two not above ``world_size``: the ranks the butterfly runs on."""
    return 1 << (world_size.bit_length() - 1)


def butterfly_distances(base: int) -> list[int]:
    """The peers' distances over ``base`` ranks, 1, 2, ..., base / 2: one step each."""
    return [1 << k for k in range(base.bit_length() - 1)]


def aligned_group(rank: int, distance: int) -> range:
    """The ``distance`` ranks of ``rank``'s aligned group (starting at a multiple of ``distance``)."""
    start = rank - rank % distance
    return range(start, start + distance)


def _chunks_per_rank(world_size: int) -> list[tuple[int, ...]]:
    # with one chunk per rank's share, butterfly rank v handles its own and that of extra rank P' + v
    base = power_of_two_base(world_size)
    return [(v, base + v) if base + v < world_size else (v,) for v in range(base)]


def fold_in_steps(world_size: int, chunks: Callable[[int], Iterable[int]], reduce: bool) -> list[Step]:
    """The step in which each rank beyond the base sends ``chunks(rank)`` to its partner in the base."""
    base = power_of_two_base(world_size)
    extras = range(base, world_size)
    return [Step(Transfer(e, e - base, c, reduce) for e in extras for c in chunks(e))] if extras else []


def fold_out_steps(world_size: int, chunks: Callable[[int], Iterable[int]]) -> list[Step]:
    """The step in which each rank beyond the base receives ``chunks(rank)`` from its partner."""
    base = power_of_two_base(world_size)
    extras = range(base, world_size)
    return [Step(Transfer(e - base, e, c) for e in extras for c in chunks(e))] if extras else []


def halving_steps(chunks_of: Sequence[Sequence[int]]) -> list[Step]:
    """Recursive halving over the base, butterfly rank v handling ``chunks_of[v]``."""
    # rank r is responsible for the chunks of its aligned group of 2d ranks; it keeps its own half
    # and hands its peer, reduced, the half the peer's group of d ranks is responsible for
    base = len(chunks_of)
    return [
        Step(
            Transfer(r, r ^ d, c, reduce=True)
            for r in range(base)
            for v in aligned_group(r ^ d, d)
            for c in chunks_of[v]
        )
        for d in reversed(butterfly_distances(base))
    ]


def doubling_steps(chunks_of: Sequence[Sequence[int]]) -> list[Step]:
    """Recursive doubling over the base, butterfly rank v handling ``chunks_of[v]``."""
    # rank r holds the chunks of its aligned group of d ranks and sends them all to its peer
    base = len(chunks_of)
    return [
        Step(Transfer(r, r ^ d, c) for r in range(base) for v in aligned_group(r, d) for c in chunks_of[v])
        for d in butterfly_distances(base)
    ]


def reduce_scatter(shares: Sequence[int]) -> Schedule:
    """Recursive-halving reduce-scatter; rank ``r`` ends with its share of ``shares[r]`` elements reduced."""
    size = len(shares)
    steps = [
        *fold_in_steps(size, lambda e: range(size), reduce=True),
        *halving_steps(_chunks_per_rank(size)),
        *fold_out_steps(size, lambda e: (e,)),
    ]
    return share_schedule("reduce_scatter", "butterfly", shares, steps)


def allgather(shares: Sequence[int]) -> Schedule:
    """Recursive-doubling all-gather; rank ``r`` contributes ``shares[r]`` elements and ends with them all."""
    size = len(shares)
    steps = [
        *fold_in_steps(size, lambda e: (e,), reduce=False),
        *doubling_steps(_chunks_per_rank(size)),
        *fold_out_steps(size, lambda e: (c for c in range(size) if c != e)),
    ]
    return share_schedule("allgather", "butterfly", shares, steps)


def allreduce(world_size: int, count: int) -> Schedule:
    """Recursive-doubling allreduce of ``count`` elements over ``world_size`` ranks, as one chunk."""
    base = power_of_two_base(world_size)
    whole = (0,)
    steps = [
        *fold_in_steps(world_size, lambda e: whole, reduce=True),
        # farthest peers first, the order of the halving, so both allreduces round alike
        *(
            Step(Transfer(r, r ^ d, 0, reduce=True) for r in range(base))
            for d in reversed(butterfly_distances(base))
        ),
        *fold_out_steps(world_size, lambda e: whole),
    ]
    return Schedule.named("allreduce", "butterfly", world_size, (count,), steps)


def cost(collective: str, shares: Sequence[int]) -> Cost:
    """Steps and elements sent per rank, from the table above."""
    size, total = len(shares), sum(shares)
    base = power_of_two_base(size)
    distances = butterfly_distances(base)
    folds = [base + r < size for r in range(base)]
    extra = [shares[base + r] if folds[r] else 0 for r in range(base)]
    handled = [shares[r] + extra[r] for r in range(base)]
    steps = len(distances) + (2 if size > base else 0)

    def group(rank: int, d: int) -> int:
        return sum(handled[v] for v in aligned_group(rank, d))

    if collective == "reduce_scatter":
        sent = [sum(group(r ^ d, d) for d in distances) + extra[r] for r in range(base)]
        return Cost(steps, (*sent, *(total for _ in range(base, size))))
    if collective == "allgather":
        back = [total - extra[r] if folds[r] else 0 for r in range(base)]
        sent = [sum(group(r, d) for d in distances) + back[r] for r in range(base)]
        return Cost(steps, (*sent, *shares[base:]))
    if collective == "allreduce":
        sent = [(len(distances) + folds[r]) * total for r in range(base)]
        return Cost(steps, (*sent, *(total for _ in range(base, size))))
    raise ValueError(f"the butterfly has no {collective!r}")


# --- one rank's part, from its peers alone

ChunksOf = Callable[[int], Sequence[int]]
"""The chunks butterfly rank v handles (``_chunks_per_rank``'s entries), computed on demand."""


def _shared_chunks(world_size: int) -> ChunksOf:
    base = power_of_two_base(world_size)
    return lambda v: (v, base + v) if base + v < world_size else (v,)


def fold_in_part(
    size: int, rank: int, chunks: Callable[[int], Iterable[int]], reduce: bool
) -> list[RankStep]:
    """``rank``'s part of :func:`fold_in_steps`."""
    base = power_of_two_base(size)
    if size == base:
        return []
    if rank >= base:
        return [RankStep(tuple(Transfer(rank, rank - base, c, reduce) for c in chunks(rank)), ())]
    extra = base + rank
    got = tuple(Transfer(extra, rank, c, reduce) for c in chunks(extra)) if extra < size else ()
    return [RankStep((), got)]


def fold_out_part(size: int, rank: int, chunks: Callable[[int], Iterable[int]]) -> list[RankStep]:
    """``rank``'s part of :func:`fold_out_steps`."""
    base = power_of_two_base(size)
    if size == base:
        return []
    if rank >= base:
        return [RankStep((), tuple(Transfer(rank - base, rank, c) for c in chunks(rank)))]
    extra = base + rank
    return [RankStep(tuple(Transfer(rank, extra, c) for c in chunks(extra)) if extra < size else (), ())]


def halving_part(base: int, rank: int, chunks_of: ChunksOf) -> list[RankStep]:
    """``rank``'s part of :func:`halving_steps` (idle steps beyond the base)."""
    if rank >= base:
        return [RankStep((), ())] * (base.bit_length() - 1)
    return [
        RankStep(
            tuple(
                Transfer(rank, rank ^ d, c, True) for v in aligned_group(rank ^ d, d) for c in chunks_of(v)
            ),
            tuple(Transfer(rank ^ d, rank, c, True) for v in aligned_group(rank, d) for c in chunks_of(v)),
        )
        for d in reversed(butterfly_distances(base))
    ]


def doubling_part(base: int, rank: int, chunks_of: ChunksOf) -> list[RankStep]:
    """``rank``'s part of :func:`doubling_steps` (idle steps beyond the base)."""
    if rank >= base:
        return [RankStep((), ())] * (base.bit_length() - 1)
    return [
        RankStep(
            tuple(Transfer(rank, rank ^ d, c) for v in aligned_group(rank, d) for c in chunks_of(v)),
            tuple(Transfer(rank ^ d, rank, c) for v in aligned_group(rank ^ d, d) for c in chunks_of(v)),
        )
        for d in butterfly_distances(base)
    ]


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part of the butterfly's schedule, from its peers alone (see ``base``)."""
    size = len(shares)
    base = power_of_two_base(size)
    every = range(size)
    if collective == "reduce_scatter":
        steps = [
            *fold_in_part(size, rank, lambda e: every, reduce=True),
            *halving_part(base, rank, _shared_chunks(size)),
            *fold_out_part(size, rank, lambda e: (e,)),
        ]
    elif collective == "allgather":
        steps = [
            *fold_in_part(size, rank, lambda e: (e,), reduce=False),
            *doubling_part(base, rank, _shared_chunks(size)),
            *fold_out_part(size, rank, lambda e: [c for c in every if c != e]),
        ]
    elif collective == "allreduce":
        whole = (0,)
        steps = [
            *fold_in_part(size, rank, lambda e: whole, reduce=True),
            *(
                RankStep((Transfer(rank, rank ^ d, 0, True),), (Transfer(rank ^ d, rank, 0, True),))
                if rank < base
                else RankStep((), ())
                for d in reversed(butterfly_distances(base))
            ),
            *fold_out_part(size, rank, lambda e: whole),
        ]
        return RankProgram.named("allreduce", "butterfly", size, (sum(shares),), steps, rank=rank)
    else:
        return None
    return RankProgram.named(collective, "butterfly", size, shares, steps, rank=rank, chunk_owner=every)


def _group_sums(values: Sequence[int], distance: int) -> list[int]:
    # the sums of values over the aligned groups of ``distance``
    return [sum(values[start : start + distance]) for start in range(0, len(values), distance)]


def butterfly_traffic(
    handled: Sequence[Sequence[int]], halving: bool, doubling: bool
) -> list[tuple[int, int, int]]:
    """(messages, elements, reduced) of the busiest rank at each halving and doubling step.

    ``handled[v]`` are the sizes of the chunks butterfly rank v handles. At the
    step of distance d a rank sends the chunks of one aligned group of d ranks and
    receives those of another, so the busiest moves the largest group's.
    """
    nonzero = [sum(1 for n in sizes_v if n) for sizes_v in handled]
    elements = [sum(sizes_v) for sizes_v in handled]
    distances = butterfly_distances(len(handled))
    counted = []
    if halving:
        for d in reversed(distances):
            most = max(_group_sums(elements, d))
            counted.append((max(_group_sums(nonzero, d)), most, most))
    if doubling:
        for d in distances:
            counted.append((max(_group_sums(nonzero, d)), max(_group_sums(elements, d)), 0))
    return counted


def fold_traffic(moved: Iterable[tuple[int, int]], reduce: bool) -> tuple[int, int, int]:
    """(messages, elements, reduced) of a fold step whose pairs move ``moved`` (chunks, elements)."""
    pairs = list(moved)
    elements = max(n for _, n in pairs)
    return max(m for m, _ in pairs), elements, elements if reduce else 0


def total_traffic(counted: Iterable[tuple[int, int, int]]) -> Traffic:
    """The traffic of the steps ``counted`` (messages, elements, reduced); steps moving nothing left out."""
    moving = [c for c in counted if c[1]]
    return Traffic(
        len(moving), sum(c[0] for c in moving), sum(c[1] for c in moving), sum(c[2] for c in moving)
    )


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The name and counted traffic of the butterfly's schedule of an even split (see ``base``)."""
    size = world_size
    base = power_of_two_base(size)
    extras = range(base, size)
    name = schedule_name(collective, "butterfly", size)
    if collective == "allreduce":
        steps = [(1, count, count)] * (base.bit_length() - 1)
        folds = [(1, count, count), (1, count, 0)] if extras else []
        return name, total_traffic([*folds[:1], *steps, *folds[1:]])
    shares = even_split(count, size)
    handled = [[shares[c] for c in _shared_chunks(size)(v)] for v in range(base)]
    nonzero = sum(1 for n in shares if n)
    alone = [(int(shares[e] > 0), shares[e]) for e in extras]  # an extra rank's own chunk
    if collective == "reduce_scatter":
        fold_in = [fold_traffic([(nonzero, count)], reduce=True)] if extras else []
        fold_out = [fold_traffic(alone, reduce=False)] if extras else []
        middle = butterfly_traffic(handled, halving=True, doubling=False)
    elif collective == "allgather":
        fold_in = [fold_traffic(alone, reduce=False)] if extras else []
        gathered = ((nonzero - m, count - n) for m, n in alone)
        fold_out = [fold_traffic(gathered, reduce=False)] if extras else []
        middle = butterfly_traffic(handled, halving=False, doubling=True)
    else:
        return None
    return name, total_traffic([*fold_in, *middle, *fold_out])
