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

__all__ = ["barrier", "cost"]

from collections.abc import Sequence

from ..schedule import Schedule, Step, Transfer
from .base import Cost


def _rounds(world_size: int) -> int:
    """ceil(log2 P), exactly, for P >= 1."""
    return (world_size - 1).bit_length()


def barrier(world_size: int) -> Schedule:
    """The dissemination barrier over ``world_size`` ranks."""
    size = world_size
    return Schedule(
        name=f"barrier-dissemination(n={size})",
        collective="barrier",
        world_size=size,
        chunk_sizes=(1,),
        steps=tuple(
            Step(Transfer(r, (r + (1 << k)) % size, 0, reduce=True) for r in range(size))
            for k in range(_rounds(size))
        ),
    )


def cost(collective: str, shares: Sequence[int]) -> Cost:
    """Steps and tokens sent per rank; ``shares`` only gives the world size."""
    if collective != "barrier":
        raise ValueError(f"dissemination has no {collective!r}")
    rounds = _rounds(len(shares))
    return Cost(rounds, (rounds,) * len(shares))
