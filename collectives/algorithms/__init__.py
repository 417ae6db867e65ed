"""The algorithms, by name, and the one place schedules are built and cached."""

__all__ = ["ALGORITHMS", "build_schedule"]

from collections.abc import Callable, Sequence
from functools import lru_cache
from types import ModuleType

from ..chunking import even_split
from ..errors import UnknownAlgorithmError
from ..schedule import Schedule
from ..specs import get_spec
from . import butterfly, double_tree, halving_doubling, hierarchical, multi_ring, ring, tree

ALGORITHMS: dict[str, ModuleType] = {
    "ring": ring,
    "tree": tree,
    "double_tree": double_tree,
    "butterfly": butterfly,
    "halving_doubling": halving_doubling,
    "multi_ring": multi_ring,
    "hierarchical": hierarchical,
}


def _builder(collective: str, algorithm: str) -> Callable[..., Schedule]:
    get_spec(collective)
    module = ALGORITHMS.get(algorithm)
    builder = getattr(module, collective, None)
    if builder is None:
        valid = [name for name, m in ALGORITHMS.items() if hasattr(m, collective)]
        raise UnknownAlgorithmError(
            f"unknown algorithm {algorithm!r} for {collective}; valid algorithms are {', '.join(valid)}"
        )
    return builder  # type: ignore[no-any-return]


@lru_cache(maxsize=256)
def _cached(collective: str, algorithm: str, world_size: int, shares: tuple[int, ...]) -> Schedule:
    builder = _builder(collective, algorithm)
    if get_spec(collective).shared:
        return builder(shares)
    return builder(world_size, sum(shares))


def build_schedule(
    collective: str,
    algorithm: str,
    world_size: int,
    count: int,
    shares: Sequence[int] | None = None,
) -> Schedule:
    """The schedule of ``algorithm`` for ``collective`` (memoized).

    Args:
        collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
        algorithm: an algorithm's name, e.g. ``"ring"``.
        world_size: the number of ranks.
        count: elements in each rank's full buffer.
        shares: for reduce_scatter and allgather, the elements of each rank's
            share of the buffer; an even split of ``count`` when omitted.
    """
    _builder(collective, algorithm)  # fail early, and uncached, on a bad name
    if shares is None or not get_spec(collective).shared:
        shares = even_split(count, world_size)
    elif len(shares) != world_size or sum(shares) != count:
        raise ValueError(f"shares {tuple(shares)} do not split {count} elements over {world_size} ranks")
    return _cached(collective, algorithm, world_size, tuple(shares))
