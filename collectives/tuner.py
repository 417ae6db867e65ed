"""The online tuner: a repeated call's best predicted algorithms timed on its first runs, the fastest kept.

As NCCL's tuner plugins and Horovod's autotune do, the choice of the cost model
is checked by measurement: for each call shape (collective, count, itemsize,
features) that asks for ``"auto"``, the first calls run the few candidates the
model predicts fastest in turn (each call's result is correct whichever runs),
one untimed round and then :data:`ROUNDS` timed ones; on the next call the ranks
agree on one algorithm: rank 0 takes, per candidate, the slowest rank's median
(what a collective waits for) and sends the index of the least to every rank.
From then on the shape runs that algorithm, and may take the repeat-call fast
path, which trial calls never take (see :mod:`collectives.repeats`).

Every rank makes the same calls in the same order (the watchdog checks it), so
every rank's tuner is at the same trial of a shape in the same call, and the
agreement is one message from each rank to rank 0 and one back.
"""

__all__ = ["CANDIDATES", "ROUNDS", "TUNE_ENV", "Tuner", "tuning_wanted"]

import math
import statistics
import struct
import time
from collections.abc import Callable
from typing import Any

from ._env import env_flag
from .call import Call, Tracked
from .errors import ConfigurationError
from .selector import Selector
from .transport.base import Transport
from .transport.tags import Tag

TUNE_ENV = "COLLECTIVES_TUNE"
"""``1`` turns the online tuner on for every communicator made after it is set (the same on every rank)."""

CANDIDATES = 3
"""The best predicted algorithms timed per call shape."""

ROUNDS = 3
"""Timed calls per candidate, after one untimed call each (plans, caches and pages made once)."""

_KEPT = 1024  # call shapes remembered; past that, forgotten all at once, as the selector's choices are


def tuning_wanted(tune: bool | None) -> bool:
    """``tune`` if given, else ``$COLLECTIVES_TUNE`` (off where unset)."""
    if tune is None:
        tune = env_flag(TUNE_ENV)
    if tune is not None and not isinstance(tune, bool):
        raise ConfigurationError(f"tune must be True, False or None, got {tune!r}")
    return bool(tune)


class _Shape:
    """One call shape's trials: the candidates, each one's times on this rank, and the decision."""

    __slots__ = ("candidates", "decided", "measured", "times", "turn")

    def __init__(self, candidates: tuple[str, ...]) -> None:
        self.candidates = candidates
        self.times: list[list[float]] = [[] for _ in candidates]
        self.turn = 0  # trials run so far
        self.decided: str | None = candidates[0] if len(candidates) == 1 else None
        self.measured: tuple[tuple[str, float], ...] = ()

    @property
    def trials(self) -> int:
        return len(self.candidates) * (ROUNDS + 1)


class Tuner:
    """One communicator's online tuner (see the module's text).

    Args:
        clock: seconds now; a test injects its own to force timings.
        candidates: the best predicted algorithms timed per call shape.
    """

    def __init__(self, clock: Callable[[], float] = time.perf_counter, candidates: int = CANDIDATES) -> None:
        self.clock = clock
        self.candidates = candidates
        self._shapes: dict[tuple[Any, ...], _Shape] = {}
        self._pending: tuple[_Shape, int, float] | None = None  # (shape, candidate, start) of a trial

    @property
    def timing(self) -> bool:
        """Whether the call in progress is a trial (timed, and not one for the repeat-call fast path)."""
        return self._pending is not None

    def decided(
        self, collective: str, world_size: int, count: int, itemsize: int, features: frozenset[str]
    ) -> str | None:
        """The agreed algorithm of the shape, or ``None`` while it is still being tuned; never sends."""
        shape = self._shapes.get((collective, world_size, count, itemsize, features))
        return None if shape is None else shape.decided

    def measured(
        self, collective: str, world_size: int, count: int, itemsize: int, features: frozenset[str]
    ) -> tuple[tuple[str, float], ...]:
        """What the agreement weighed for the shape: each candidate's slowest-rank median, fastest first."""
        shape = self._shapes.get((collective, world_size, count, itemsize, features))
        return () if shape is None else shape.measured

    def choose(
        self,
        call: Call,
        transport: Transport,
        selector: Selector,
        collective: str,
        count: int,
        itemsize: int,
        features: frozenset[str],
    ) -> str:
        """The algorithm this call of the shape runs: a trial's, the agreed one, or (agreeing now) the best.

        A trial is timed from here until :meth:`finish`.

        Raises:
            UnknownAlgorithmError: no algorithm applies (as :meth:`Selector.choose`).
            CollectiveTimeout: a rank's times, or rank 0's decision, did not come in time.
        """
        key = (collective, transport.size, count, itemsize, features)
        shape = self._shapes.get(key)
        if shape is None:
            ranked = selector.ranked(collective, transport.size, count, itemsize, features)
            if len(self._shapes) >= _KEPT:
                self._shapes.clear()
            shape = self._shapes[key] = _Shape(tuple(c.algorithm for c in ranked[: self.candidates]))
        if shape.decided is not None:
            return shape.decided
        if shape.turn < shape.trials:
            index = shape.turn % len(shape.candidates)
            self._pending = (shape, index, self.clock())
            return shape.candidates[index]
        self._agree(call, transport, shape)
        assert shape.decided is not None  # set by _agree
        return shape.decided

    def finish(self) -> None:
        """End the call in progress: a trial's time is kept (its first round untimed)."""
        pending = self._pending
        if pending is None:
            return
        self._pending = None
        shape, index, start = pending
        elapsed = self.clock() - start
        if shape.turn >= len(shape.candidates):
            shape.times[index].append(elapsed)
        shape.turn += 1

    def _agree(self, call: Call, transport: Transport, shape: _Shape) -> None:
        """Every rank's medians to rank 0; rank 0's choice (least of the slowest ranks' medians) to all."""
        mine = [statistics.median(times) if times else math.inf for times in shape.times]
        n = len(mine)
        row = struct.Struct(f"{n}d")
        size, rank = transport.size, transport.rank
        step = "the tuner's agreement"
        decision = bytearray(8 * (n + 1))  # the index chosen, then the medians it weighed
        if rank == 0:
            rows = [bytearray(row.size) for _ in range(1, size)]
            _exchange(call, transport, [], list(zip(rows, range(1, size), strict=True)), step)
            slowest = mine[:]
            for data in rows:
                slowest = [max(a, b) for a, b in zip(slowest, row.unpack(data), strict=True)]
            best = min(range(n), key=lambda i: (slowest[i], i))  # ties: the better predicted
            struct.pack_into(f"{n + 1}d", decision, 0, float(best), *slowest)
            _exchange(call, transport, [(decision, peer) for peer in range(1, size)], [], step)
        else:
            _exchange(call, transport, [(bytearray(row.pack(*mine)), 0)], [(decision, 0)], step)
        best, *slowest = struct.unpack(f"{n + 1}d", decision)
        shape.decided = shape.candidates[int(best)]
        shape.measured = tuple(sorted(zip(shape.candidates, slowest, strict=True), key=lambda m: m[1]))


def _exchange(
    call: Call, transport: Transport, sends: list[tuple[Any, int]], receives: list[tuple[Any, int]], step: str
) -> None:
    """Send and receive ``(buffer, peer)`` messages of the tuner's tag under ``call``'s deadline."""
    requests = [transport.irecv(buffer, peer, Tag.TUNER) for buffer, peer in receives]
    requests += [transport.isend(buffer, peer, Tag.TUNER) for buffer, peer in sends]
    peers = [Tracked(None, peer, False) for _, peer in receives] + [
        Tracked(None, peer, True) for _, peer in sends
    ]
    call.wait(requests, step, peers, transport)
