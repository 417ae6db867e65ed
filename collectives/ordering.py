"""Whether an algorithm combines the ranks' contributions in rank order, as a non-commutative op needs."""

__all__ = ["keeps_rank_order"]

import bisect
from collections.abc import Sequence
from functools import lru_cache

from .algorithms import rank_program
from .schedule import RankProgram

# A chunk's value, symbolically: the ranks lo:hi combined in order, or None where contributions met
# out of order. Joining two is O(1), so the check costs the schedule's transfers, whatever the count.
_Value = tuple[int, int] | None


def _join(a: _Value, b: _Value) -> _Value:
    """``a op b`` for an op that is only associative: defined when ``a``'s ranks just precede ``b``'s."""
    if a is None or b is None or a[1] != b[0]:
        return None
    return a[0], b[1]


def keeps_rank_order(
    collective: str,
    algorithm: str,
    world_size: int,
    count: int,
    shares: Sequence[int] | None = None,
    root: int = 0,
) -> bool:
    """Whether ``algorithm`` reduces ``x0 op x1 op ... op x(P-1)`` in rank order (for non-commutative ops).

    Runs the schedule's transfers on symbolic chunks that record which ranks they
    combine, reducing as the executor does (:func:`collectives.execute.run`: within
    a step in schedule order, the lower rank's operand first), and checks that each
    result holds every rank in order: the allreduce on every rank, the
    reduce-scatter's shares, the reduce's root. It stops at the first reduction of
    two partial results that are not neighbours in rank order: nothing can put
    such a result back in order. Built from the ranks' programs (bounded memos,
    never the global schedule) and memoized; the cost is the transfers, whatever
    the count, and an algorithm out of order is found at its first such reduction.
    """
    kept = None if shares is None else tuple(shares)
    return _ordered(collective, algorithm, world_size, count, kept, root)


@lru_cache(maxsize=256)
def _ordered(
    collective: str, algorithm: str, size: int, count: int, shares: tuple[int, ...] | None, root: int
) -> bool:
    if size == 1 or count == 0:
        return True
    programs: list[RankProgram | None] = [None] * size

    def program(rank: int) -> RankProgram:
        made = programs[rank]
        if made is None:
            made = programs[rank] = rank_program(
                collective, algorithm, size, count, shares, root=root, rank=rank
            )
        return made

    sizes = program(0).chunk_sizes
    state: list[list[_Value]] = [[(r, r + 1)] * len(sizes) for r in range(size)]
    for index in range(len(program(0).steps)):
        # every send reads the chunk as the step began; receives land in schedule order
        landed: dict[tuple[int, int], _Value] = {}
        for rank in range(size):
            for t in program(rank).steps[index].recvs:
                if not sizes[t.chunk]:
                    continue
                value = state[t.src][t.chunk]
                if t.reduce:
                    own = landed.get((rank, t.into), state[rank][t.into])
                    value = _join(value, own) if t.src < rank else _join(own, value)
                    if value is None:
                        return False
                landed[(rank, t.into)] = value
        for (rank, chunk), value in landed.items():
            state[rank][chunk] = value
    return _results_in_order(collective, state, sizes, size, count, shares, root)


def _results_in_order(
    collective: str,
    state: list[list[_Value]],
    sizes: tuple[int, ...],
    size: int,
    count: int,
    shares: tuple[int, ...] | None,
    root: int,
) -> bool:
    """Whether the chunks the collective's result is made of hold every rank, in order."""
    whole = (0, size)
    chunks = [c for c in range(len(sizes)) if sizes[c]]
    if collective == "allreduce":
        return all(state[r][c] == whole for r in range(size) for c in chunks)
    if collective == "reduce":
        return all(state[root][c] == whole for c in chunks)
    if collective == "reduce_scatter":
        per_rank = shares if shares is not None else (count // size,) * size
        starts = [sum(sizes[:c]) for c in range(len(sizes) + 1)]
        edges = [sum(per_rank[:r]) for r in range(size + 1)]
        for r in range(size):
            first = bisect.bisect_right(starts, edges[r]) - 1
            last = bisect.bisect_left(starts, edges[r + 1])
            if any(state[r][c] != whole for c in range(max(first, 0), min(last, len(sizes))) if sizes[c]):
                return False
        return True
    return True  # the collectives that do not reduce
