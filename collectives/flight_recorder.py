"""The flight recorder and the debug log: the last calls of a communicator, one line each."""

__all__ = ["Recorded", "new_recorder", "record_lines", "record_text", "write_debug_line"]

import sys
from collections import deque

from .call import Call, Starts
from .watch_settings import recorded_calls

Recorded = Call | Starts
"""An entry of the recorder: one call, or a persistent call's lean starts in a row."""


def new_recorder() -> "deque[Recorded]":
    """An empty recorder keeping the last ``$COLLECTIVES_FLIGHT_RECORDER`` calls (64 by default).

    A plain deque: every call appends to it, and a persistent call's starts look at its last entry.
    """
    return deque(maxlen=recorded_calls())


def record_lines(recorder: "deque[Recorded]", rank: int) -> list[str]:
    """The recorded calls, oldest first, one line each."""
    return [call.line(rank) for call in recorder]


def record_text(recorder: "deque[Recorded]", rank: int) -> str:
    """The recorded calls under a heading naming the rank, as a timeout's error shows them."""
    lines = record_lines(recorder, rank)
    return f"last {len(lines)} collectives on rank {rank}:\n  " + "\n  ".join(lines)


def write_debug_line(path: str | None, rank: int, line: str) -> None:
    """One line of the debug log: to stderr, or appended to ``path`` (``{rank}`` in it is the rank)."""
    if path is None:
        print(line, file=sys.stderr, flush=True)
        return
    # opened per line, so nothing is left open however the program ends
    with open(path.replace("{rank}", str(rank)), "a") as file:
        file.write(line + "\n")
