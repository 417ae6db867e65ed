"""The algorithms, by name, and the one place schedules are built and cached (in :mod:`.registry`).

What an algorithm module provides is written down in :mod:`collectives.algorithms.base`.
"""

__all__ = [
    "ALGORITHMS",
    "PROGRAMS_BUDGET",
    "PROGRAMS_KEPT",
    "build_schedule",
    "clear_programs",
    "rank_program",
    "schedule_traffic",
]

from .registry import (
    ALGORITHMS,
    PROGRAMS_BUDGET,
    PROGRAMS_KEPT,
    build_schedule,
    clear_programs,
    rank_program,
    schedule_traffic,
)
