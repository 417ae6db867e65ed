"""Rabenseifner's allreduce: a butterfly reduce-scatter, then a butterfly all-gather.

The buffer is cut into one chunk per rank of the butterfly, and the allreduce
is the ``butterfly`` module's recursive-halving reduce-scatter of those chunks
followed by its recursive-doubling all-gather, with the same fold for world
sizes that are not a power of two: extra rank P' + i first hands its whole
buffer to rank i, reduced, and gets the result back at the end. Like the ring
it sends under 2 S elements per rank whatever P (ranks that fold send S more),
but in 2 log2 P' (+ 2) steps instead of 2 (P - 1), so it suits large messages
on many ranks, where the ``butterfly`` allreduce, sending S at each of its
steps, does not.

The family lives in ``butterfly``; this module exists because algorithms are
registered by name, one function per collective, and ``butterfly``'s allreduce
is the recursive-doubling one. Its reduce-scatter and all-gather would be the
``butterfly`` module's, so they are not registered twice under this name.

Each chunk is reduced at one rank only and then copied, so every rank ends with
the same bits, NaN payloads included. The reduction order is the butterfly's
(rank P' + i joins rank i first, then peers P'/2 apart meet first), so the bits
equal the ``butterfly`` allreduce's and generally differ from the ring's.

Cost, for P ranks and a buffer of S elements. P' = the largest power of two not
above P, E = P - P', m = log2 P' and f = 1 if E > 0 else 0; the chunks are
C_v = even_split(S, P')[v], C(r, d) is the sum of C_v over the d ranks v with
v // d == r // d, and sums run over the distances d = 1, 2, ..., P'/2:

==========  =======  =============================================  ===========
collective  steps    elements sent by rank r < P'                   rank P' + i
==========  =======  =============================================  ===========
allreduce   2m + 2f  sum_d (C(r XOR d, d) + C(r, d)) + [r < E] S    S
==========  =======  =============================================  ===========

When P' divides S that is 2 (P' - 1) / P' * S, plus S for the ranks that fold.
"""

__all__ = ["allreduce", "cost", "rank_program", "schedule_traffic"]

from collections.abc import Sequence

from ..chunking import even_split
from ..schedule import RankProgram, Schedule, schedule_name
from ..topology.cost_model import Traffic
from .base import Cost
from .butterfly import (
    aligned_group,
    butterfly_distances,
    butterfly_traffic,
    doubling_part,
    doubling_steps,
    fold_in_part,
    fold_in_steps,
    fold_out_part,
    fold_out_steps,
    fold_traffic,
    halving_part,
    halving_steps,
    power_of_two_base,
    total_traffic,
)


def allreduce(world_size: int, count: int) -> Schedule:
    """Halving-doubling allreduce of ``count`` elements over ``world_size`` ranks."""
    base = power_of_two_base(world_size)
    every = range(base)
    chunks_of = [(v,) for v in every]
    steps = [
        *fold_in_steps(world_size, lambda e: every, reduce=True),
        *halving_steps(chunks_of),
        *doubling_steps(chunks_of),
        *fold_out_steps(world_size, lambda e: every),
    ]
    return Schedule.named("allreduce", "halving_doubling", world_size, even_split(count, base), steps)


def cost(collective: str, shares: Sequence[int]) -> Cost:
    """Steps and elements sent per rank, from the table above (only the shares' number and total count)."""
    if collective != "allreduce":
        raise ValueError(f"halving_doubling has no {collective!r}; the butterfly's is the same schedule")
    size, total = len(shares), sum(shares)
    base = power_of_two_base(size)
    chunks = even_split(total, base)
    distances = butterfly_distances(base)

    def group(rank: int, d: int) -> int:
        return sum(chunks[v] for v in aligned_group(rank, d))

    sent = [
        sum(group(r ^ d, d) + group(r, d) for d in distances) + (total if r + base < size else 0)
        for r in range(base)
    ]
    steps = 2 * len(distances) + (2 if size > base else 0)
    return Cost(steps, (*sent, *(total for _ in range(base, size))))


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s part, from its peers alone (see ``base``)."""
    if collective != "allreduce":
        return None
    size, count = len(shares), sum(shares)
    base = power_of_two_base(size)
    every = range(base)

    def own(v: int) -> tuple[int, ...]:
        return (v,)

    steps = (
        *fold_in_part(size, rank, lambda e: every, reduce=True),
        *halving_part(base, rank, own),
        *doubling_part(base, rank, own),
        *fold_out_part(size, rank, lambda e: every),
    )
    return RankProgram.named("allreduce", "halving_doubling", size, even_split(count, base), steps, rank=rank)


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """The name and counted traffic, by the butterfly's formulas (see ``base``)."""
    if collective != "allreduce":
        return None
    base = power_of_two_base(world_size)
    chunks = even_split(count, base)
    nonzero = sum(1 for n in chunks if n)
    moved = [(nonzero, count)]
    folds = [fold_traffic(moved, True), fold_traffic(moved, False)] if world_size > base else []
    middle = butterfly_traffic([[n] for n in chunks], halving=True, doubling=True)
    name = schedule_name("allreduce", "halving_doubling", world_size)
    return name, total_traffic([*folds[:1], *middle, *folds[1:]])
