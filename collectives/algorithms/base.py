"""What every algorithm module provides."""

__all__ = ["Cost"]

from typing import NamedTuple


class Cost(NamedTuple):
    """An algorithm's documented traffic: rounds of transfers and elements each rank sends.

    Every algorithm module gives it from ``cost(collective, shares)``, with a
    ``root=`` keyword where it implements a rooted collective, and the tests
    check it against the simulator's counts.
    """

    steps: int
    elements_sent: tuple[int, ...]
