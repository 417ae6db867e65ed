"""The dissemination barrier: every rank hears from every other in ceil(log2 P) rounds.

In round k rank r signals rank r + 2^k and waits for rank r - 2^k (mod P).
After round k rank r has heard, directly or through the ranks it heard from,
from ranks r - 2^(k+1) + 1 to r, so ceil(log2 P) rounds reach every rank for any
P, a power of two or not (Hensgen, Finkel and Manber, 1988). No rank is a hot
spot, unlike the star of the direct barrier. A signal is a one-element token;
some ranks are heard from twice when P is not a power of two, which is harmless,
as a barrier's tokens carry no data.

Cost, for P ranks: ceil(log2 P) steps; every rank sends ceil(log2 P) tokens.
"""

__all__ = ["barrier", "cost", "rank_program", "schedule_traffic"]

from collections.abc import Sequence

from ..schedule import RankProgram, RankStep, Schedule, Step, Transfer, schedule_name
from ..topology.cost_model import Traffic
from .base import Cost


def _rounds(world_size: int) -> int:
    """ceil(log2 P), exactly, for P >= 1."""
    return (world_size - 1).bit_length()


def barrier(world_size: int) -> Schedule:
    """The dissemination barrier over ``world_size`` ranks."""
    size = world_size
    steps = (
        Step(Transfer(r, (r + (1 << k)) % size, 0, reduce=True) for r in range(size))
        for k in range(_rounds(size))
    )
    return Schedule.named("barrier", "dissemination", size, (1,), steps)


def cost(collective: str, shares: Sequence[int]) -> Cost:
    """Steps and tokens sent per rank; ``shares`` only gives the world size."""
    if collective != "barrier":
        raise ValueError(f"dissemination has no {collective!r}")
    rounds = _rounds(len(shares))
    return Cost(rounds, (rounds,) * len(shares))


def rank_program(collective: str, shares: tuple[int, ...], root: int | None, rank: int) -> RankProgram | None:
    """Rank ``rank``'s signals, one each way a round (see ``base``)."""
    if collective != "barrier":
        return None
    size = len(shares)
    steps = tuple(
        RankStep(
            (Transfer(rank, (rank + (1 << k)) % size, 0, reduce=True),),
            (Transfer((rank - (1 << k)) % size, rank, 0, reduce=True),),
        )
        for k in range(_rounds(size))
    )
    return RankProgram.named("barrier", "dissemination", size, (1,), steps, rank=rank)


def schedule_traffic(collective: str, world_size: int, count: int) -> tuple[str, Traffic] | None:
    """One token each way a round (see ``base``)."""
    if collective != "barrier":
        return None
    rounds = _rounds(world_size)
    return schedule_name("barrier", "dissemination", world_size), Traffic(rounds, rounds, rounds, rounds)
