"""The algorithms, by name, and the one place schedules are built and cached."""

__all__ = [
    "ALGORITHMS",
    "PROGRAMS_BUDGET",
    "PROGRAMS_KEPT",
    "build_schedule",
    "clear_programs",
    "rank_program",
    "schedule_traffic",
]

from collections.abc import Sequence
from functools import lru_cache

from ..chunking import even_split
from ..errors import ScheduleError, UnknownAlgorithmError
from ..memo import Bounded
from ..schedule import RankProgram, Schedule
from ..specs import check_root, get_spec
from ..topology.cost_model import Traffic, traffic
from . import (
    butterfly,
    direct,
    dissemination,
    double_tree,
    halving_doubling,
    hierarchical,
    hierarchical_shared_memory,
    multi_ring,
    ring,
    shared_memory,
    tree,
)
from .base import Algorithm, Builder, builder, implements, rank_program_builder, traffic_formula

ALGORITHMS: dict[str, Algorithm] = {
    "ring": ring,
    "tree": tree,
    "double_tree": double_tree,
    "butterfly": butterfly,
    "halving_doubling": halving_doubling,
    "multi_ring": multi_ring,
    "hierarchical": hierarchical,
    "direct": direct,
    "dissemination": dissemination,
    "shared_memory": shared_memory,
    "hierarchical_shared_memory": hierarchical_shared_memory,
}


def _builder(collective: str, algorithm: str) -> Builder:
    get_spec(collective)
    found = builder(ALGORITHMS.get(algorithm), collective)
    if found is None:
        valid = [name for name, m in ALGORITHMS.items() if implements(m, collective)]
        raise UnknownAlgorithmError(
            f"unknown algorithm {algorithm!r} for {collective}; valid algorithms are {', '.join(valid)}"
        )
    return found


@lru_cache(maxsize=256)
def _cached(
    collective: str, algorithm: str, world_size: int, shares: tuple[int, ...], root: int | None
) -> Schedule:
    build = _builder(collective, algorithm)
    spec = get_spec(collective)
    # builders take shares, or the world size and count, or for the barrier the world size alone
    if spec.shared:
        args: tuple[object, ...] = (shares,)
    elif spec.carries_data:
        args = (world_size, sum(shares))
    else:
        args = (world_size,)
    return build(*args) if root is None else build(*args, root)


def _layout(
    collective: str, algorithm: str, world_size: int, count: int, shares: Sequence[int] | None, root: int
) -> tuple[tuple[int, ...], int | None]:
    """The shares and root ``build_schedule`` builds from, checked as it documents."""
    _builder(collective, algorithm)  # fail early, and uncached, on a bad name
    spec = get_spec(collective)
    if not spec.carries_data and count:
        raise ValueError(f"{collective} moves no data; count must be 0, got {count}")
    if shares is None or not spec.shared:
        shares = even_split(count, world_size)
    elif len(shares) != world_size or sum(shares) != count:
        raise ValueError(f"shares {tuple(shares)} do not split {count} elements over {world_size} ranks")
    return tuple(shares), check_root(root, world_size) if spec.rooted else None


def build_schedule(
    collective: str,
    algorithm: str,
    world_size: int,
    count: int,
    shares: Sequence[int] | None = None,
    *,
    root: int = 0,
) -> Schedule:
    """The schedule of ``algorithm`` for ``collective`` (memoized).

    Args:
        collective: the collective's name, e.g. ``allreduce`` or ``broadcast``.
        algorithm: an algorithm's name, e.g. ``"ring"``.
        world_size: the number of ranks.
        count: elements in each rank's full buffer (alltoall's input, a
            multiple of ``world_size``; 0 for the barrier, which moves no data).
        shares: for the collectives where each rank owns a share of the buffer
            (reduce_scatter, allgather, gather, scatter), the elements of each
            rank's share; an even split of ``count`` when omitted.
        root: the root of a rooted collective (broadcast, reduce, gather,
            scatter); the others have none and ignore it.

    Raises:
        UnknownAlgorithmError: no algorithm of that name implements the collective.
        InvalidRootError: a rooted collective's root is not one of the ranks.
        ValueError: the count or shares do not fit the collective.
    """
    layout, rooted = _layout(collective, algorithm, world_size, count, shares, root)
    return _cached(collective, algorithm, world_size, layout, rooted)


PROGRAMS_KEPT = 256
"""Rank programs :func:`rank_program` remembers, at most."""

PROGRAMS_BUDGET = 1 << 19
"""The most steps, transfers and chunks the programs :func:`rank_program` remembers hold together.

A ring's program grows with the world size (at 4,096 ranks, some 8,000 steps and
4,096 chunks, about 4 MB), so a count of programs alone would not keep the memo's
memory flat.
"""


def _program_size(program: RankProgram) -> int:
    return program.num_chunks + sum(1 + len(step.sends) + len(step.recvs) for step in program.steps)


_programs: Bounded[tuple[str, str, tuple[int, ...], int | None, int], RankProgram] = Bounded(
    PROGRAMS_KEPT, PROGRAMS_BUDGET, _program_size
)


def clear_programs() -> None:
    """Forget the memoized rank programs, so that the next of each is built afresh (to time a first call)."""
    _programs.cache_clear()


def _cached_program(
    collective: str, algorithm: str, shares: tuple[int, ...], root: int | None, rank: int
) -> RankProgram:
    key = (collective, algorithm, shares, root, rank)
    program = _programs.get(key)
    if program is None:
        build = rank_program_builder(ALGORITHMS[algorithm])
        program = None if build is None else build(collective, shares, root, rank)
        if program is None:
            program = _cached(collective, algorithm, len(shares), shares, root).rank_program(rank)
        _programs.put(key, program)
    return program


def rank_program(
    collective: str,
    algorithm: str,
    world_size: int,
    count: int,
    shares: Sequence[int] | None = None,
    *,
    root: int = 0,
    rank: int,
) -> RankProgram:
    """Rank ``rank``'s part of :func:`build_schedule`'s schedule, without building it (memoized).

    The algorithm's ``rank_program`` hook computes it from the rank number, in
    time and memory proportional to that rank's transfers; an algorithm without
    one (or a case it does not cover) has the global schedule built and
    projected. Either way ``steps`` equals ``build_schedule(...).program(rank)``.
    Arguments and errors as for :func:`build_schedule`, and:

    Raises:
        ScheduleError: ``rank`` is not one of the ranks.
    """
    layout, rooted = _layout(collective, algorithm, world_size, count, shares, root)
    if not 0 <= rank < world_size:
        raise ScheduleError(f"rank {rank} is outside world size {world_size}")
    return _cached_program(collective, algorithm, layout, rooted, rank)


def schedule_traffic(collective: str, algorithm: str, world_size: int, count: int) -> tuple[str, Traffic]:
    """The name and counted traffic of ``build_schedule(collective, algorithm, world_size, count)``.

    By the algorithm's ``schedule_traffic`` formula where it has one, without
    building the schedule; otherwise the schedule is built and counted
    (:func:`collectives.topology.cost_model.traffic`). Errors as for
    :func:`build_schedule`. Not memoized: the selector remembers what it counted.
    """
    layout, rooted = _layout(collective, algorithm, world_size, count, None, 0)
    formula = traffic_formula(ALGORITHMS[algorithm])
    found = None if formula is None else formula(collective, world_size, count)
    if found is None:
        schedule = _cached(collective, algorithm, world_size, layout, rooted)
        return schedule.name, traffic(schedule)
    return found
