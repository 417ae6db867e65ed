"""What every algorithm module provides."""

__all__ = ["Cost"]

from typing import NamedTuple


class Cost(NamedTuple):
    """An algorithm's documented traffic: rounds of transfers and elements each rank sends."""

    steps: int
    elements_sent: tuple[int, ...]
