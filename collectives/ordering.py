"""Whether an algorithm's executed plans combine the ranks' contributions in rank order."""

__all__ = ["keeps_rank_order"]

import bisect
from collections import defaultdict, deque
from collections.abc import Sequence
from functools import lru_cache

from .algorithms import rank_program
from .execute import Plan, program_plan

# A chunk's value, symbolically: the ranks ``lo:hi`` combined in order, or None where
# contributions met out of order (or garbage was read). Combining two is O(1), so the
# check costs the plans' messages, whatever the count.
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

    Runs every rank's plan of the schedule, as :func:`collectives.execute.run`
    runs it (the lower rank's operand first), on symbolic chunks that record
    which ranks they combine, and checks that each result holds all of them in
    order: the allreduce on every rank, the reduce-scatter's shares, the reduce's
    root. Memoized; the cost is the plans' messages, whatever the count.
    """
    return _ordered(collective, algorithm, world_size, count, None if shares is None else tuple(shares), root)


@lru_cache(maxsize=256)
def _ordered(
    collective: str, algorithm: str, world_size: int, count: int, shares: tuple[int, ...] | None, root: int
) -> bool:
    if world_size == 1 or count == 0:
        return True
    # a separate source or not changes which buffer a reduction reads, never the order
    return all(
        _runs_in_order(collective, algorithm, world_size, count, shares, root, separate)
        for separate in (False, True)
    )


def _runs_in_order(
    collective: str,
    algorithm: str,
    size: int,
    count: int,
    shares: tuple[int, ...] | None,
    root: int,
    separate: bool,
) -> bool:
    programs = [
        rank_program(collective, algorithm, size, count, shares, root=root, rank=r) for r in range(size)
    ]
    plans: list[Plan] = [program_plan(p, 0, separate) for p in programs]
    bounds = programs[0].chunk_bounds
    chunks = len(bounds) - 1

    def span(lo: int, hi: int) -> range:
        """The chunks of elements ``lo:hi`` (plans move whole chunks when unsegmented)."""
        first = bisect.bisect_right(bounds, lo) - 1
        last = bisect.bisect_left(bounds, hi)
        return range(max(first, 0), min(last, chunks))

    source: list[list[_Value]] = [[(r, r + 1)] * chunks for r in range(size)]
    buffer: list[list[_Value]] = [[None if separate else (r, r + 1)] * chunks for r in range(size)]
    queues: dict[tuple[int, int], deque[list[_Value]]] = defaultdict(deque)
    at = [0] * size
    posted = [False] * size
    while True:
        moved = False
        for r in range(size):
            steps = plans[r].steps
            if at[r] == len(steps):
                continue
            step = steps[at[r]]
            src, buf = source[r], buffer[r]
            if not posted[r]:
                for lo, hi in step.prefill:
                    for c in span(lo, hi):
                        buf[c] = src[c]
                for m in step.sends:
                    queues[(r, m.peer)].append([(src if m.fresh else buf)[c] for c in span(m.lo, m.hi)])
                posted[r] = moved = True
            wanted: dict[int, int] = defaultdict(int)
            for m in step.recvs:
                wanted[m.peer] += 1
            if any(len(queues[(peer, r)]) < n for peer, n in wanted.items()):
                continue
            for m in step.recvs:
                came = queues[(m.peer, r)].popleft()
                for c, value in zip(span(m.lo, m.hi), came, strict=False):
                    if m.landing < 0:
                        buf[c] = value
                        continue
                    own = src[c] if m.fresh else buf[c]
                    buf[c] = _join(value, own) if m.first else _join(own, value)
            at[r] += 1
            posted[r] = False
            moved = True
        if not moved:
            break
    if at != [len(p.steps) for p in plans]:
        return False  # the plans did not pair up: not something to run an op on
    for r in range(size):
        for lo, hi in plans[r].untouched:
            for c in span(lo, hi):
                buffer[r][c] = source[r][c]
    whole = (0, size)
    nonempty = [c for c in range(chunks) if bounds[c] < bounds[c + 1]]
    if collective == "allreduce":
        return all(buffer[r][c] == whole for r in range(size) for c in nonempty)
    if collective == "reduce":
        return all(buffer[root][c] == whole for c in nonempty)
    if collective == "reduce_scatter":
        per_rank = shares if shares is not None else tuple(count // size for _ in range(size))
        edges = [sum(per_rank[:r]) for r in range(size + 1)]
        return all(
            buffer[r][c] == whole
            for r in range(size)
            for c in span(edges[r], edges[r + 1])
            if bounds[c] < bounds[c + 1]
        )
    return True  # collectives that do not reduce
