"""The ranks' clocks against rank 0's, measured by a few pings as a traced communicator is made.

Each rank but 0 sends rank 0 its clock, rank 0 answers with its own at once,
and the rank takes the round with the shortest round trip: its clock minus rank
0's is ``(sent + answered) / 2 - rank 0's``, good to half that round trip. The
trace file states the result (``otherData.clock.offsets``), and ``trace merge``
puts every rank's events on rank 0's clock by it. Only the tracing ranks take
part, by probing, so that a rank that does not trace leaves nothing posted:
the others give up after :data:`WAIT_S` and say so in their files.
"""

__all__ = ["ROUNDS", "WAIT_S", "align", "offset"]

import struct
import time
from typing import Any

from ..transport.base import Transport
from ..transport.tags import Tag

ROUNDS = 8
WAIT_S = 2.0
_TIME = struct.Struct("<d")
_now = time.monotonic


def offset(transport: Transport, wait: float = WAIT_S, rounds: int = ROUNDS) -> dict[str, Any]:
    """This rank's clock minus rank 0's on ``transport``, measured now (collective among the tracing ranks).

    Returns:
        ``offset_us``, ``round_trip_us`` and ``rounds`` (``offset_us`` is ``None``
        where rank 0 did not answer in ``wait`` seconds, with ``why``).
    """
    if transport.rank == 0:
        return _answer(transport, wait, rounds)
    best: tuple[float, float] | None = None
    deadline = _now() + wait
    for _ in range(rounds):
        ping = bytearray(_TIME.pack(_now()))
        sent = _now()
        request = transport.isend(ping, 0, Tag.CLOCK)
        found = transport.probe(Tag.CLOCK, max(deadline - _now(), 0.0))
        if found is None:
            transport.wait_for([request], 0.0)
            return {"offset_us": None, "rounds": 0, "why": f"rank 0 did not answer in {wait:g} s"}
        reply = bytearray(_TIME.size)
        transport.waitall([transport.irecv(reply, 0, Tag.CLOCK), request])  # probed: it has arrived
        back = _now()
        (theirs,) = _TIME.unpack(reply)
        trip = back - sent
        if best is None or trip < best[0]:
            best = (trip, (sent + back) / 2 - theirs)
    assert best is not None  # rounds >= 1
    return {"offset_us": round(best[1] * 1e6, 3), "round_trip_us": round(best[0] * 1e6, 3), "rounds": rounds}


def _answer(transport: Transport, wait: float, rounds: int) -> dict[str, Any]:
    """Rank 0's side: answer every ping with this clock, until each peer's rounds are done or time is up."""
    left = (transport.size - 1) * rounds
    deadline = _now() + wait
    replies = []
    while left:
        found = transport.probe(Tag.CLOCK, max(deadline - _now(), 0.0))
        if found is None:
            break
        peer = found[0]
        ping = bytearray(_TIME.size)
        transport.waitall([transport.irecv(ping, peer, Tag.CLOCK)])
        reply = bytearray(_TIME.pack(_now()))
        replies.append((transport.isend(reply, peer, Tag.CLOCK), reply))
        left -= 1
    transport.wait_for([r for r, _ in replies], max(deadline - _now(), 0.0))
    answered: dict[str, Any] = {"offset_us": 0.0, "round_trip_us": 0.0, "rounds": rounds, "reference": True}
    if left:
        answered["why"] = f"{left} pings did not come in {wait:g} s (do all ranks trace?)"
    return answered


def align(transport: Transport, number: int, record: Any) -> None:
    """Measure this rank's clock offset on a new communicator's ``transport``; ``record(number, result)``."""
    if transport.size > 1 and transport.FINDS_NODES_TOGETHER:
        record(number, offset(transport))
