"""A memo bounded by the size of what it keeps, for values that grow with the world size."""

__all__ = ["Bounded"]

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class Bounded(Generic[K, V]):
    """At most ``entries`` values, weighing at most ``budget`` together by ``weigh``.

    A rank's program or plan grows with its steps (a ring's with the world size),
    so a count of entries alone would let a cache of them grow with P: at 4,096
    ranks one ring plan holds some 8,000 steps. When a value would not fit, the
    memo starts afresh rather than evicting one by one (a lookup stays one dict
    lookup); a value heavier than the whole budget is returned but not kept.
    """

    def __init__(self, entries: int, budget: int, weigh: Callable[[V], int]) -> None:
        self._entries = entries
        self._budget = budget
        self._weigh = weigh
        self._kept: dict[K, V] = {}
        self._weight = 0

    def get(self, key: K) -> V | None:
        """The value kept for ``key``; ``None`` where there is none."""
        return self._kept.get(key)

    def put(self, key: K, value: V) -> V:
        """Keep ``value`` for ``key`` (unless it alone outweighs the budget); ``value``."""
        weight = self._weigh(value)
        if weight > self._budget:
            return value
        if len(self._kept) >= self._entries or self._weight + weight > self._budget:
            self.cache_clear()
        self._kept[key] = value
        self._weight += weight
        return value

    def cache_clear(self) -> None:
        """Let go of every value (named as ``functools.lru_cache``'s)."""
        self._kept.clear()
        self._weight = 0

    @property
    def weight(self) -> int:
        """The weight of the values kept."""
        return self._weight

    def __len__(self) -> int:
        return len(self._kept)
