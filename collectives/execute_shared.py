"""Runs the ``shared_memory`` algorithm's collectives through memory every rank of one node maps.

Why an executor of its own rather than a transport whose send copies into the
peer's memory: the point of sharing memory is to touch each byte as few times as
possible. A transport would still run the schedule's transfers one by one (copy
in, then copy into the peer's landing, then reduce, per transfer), so the
reduction of a chunk from P inputs would read them one pair at a time, and each
message would pay the executor's per-message work. Here each rank copies its
input into its own region once; the owner of each share reduces it reading all P
regions in one pass, straight into its output; and the all-gather is one copy
out of each owner's region. The algorithm's schedule
(:mod:`collectives.algorithms.shared_memory`) describes the same data movement,
so the simulator checks it and other transports run it when memory is not shared.

The buffer goes through in segments small enough for the regions to stay in
cache, double-buffered: segment ``k`` uses half ``k mod 2`` of each region, and
the barriers between phases also order a half's reuse two segments later, so
only main memory's reads of the input and writes of the output remain.
"""

__all__ = ["SMALL_BYTES", "Barrier", "SharedExecutor"]

from collections.abc import Callable, Sequence
from typing import Any

from .backends.base import ArrayBackend
from .chunking import bounds
from .ops import ReduceOp
from .transport.base import SharedMemory

Barrier = Callable[[SharedMemory, Sequence[int]], None]
"""Passes the next barrier of a shared memory, leaving a note (the watchdog bounds it by the deadline)."""


def unbounded(shared: SharedMemory, note: Sequence[int] = ()) -> None:
    """A barrier with no deadline."""
    shared.arrive(note)
    shared.wait()


SMALL_BYTES = 1 << 14
"""Allreduces up to this size take one barrier: every rank reduces the whole buffer itself."""


class SharedExecutor:
    """Allreduce, reduce-scatter and all-gather through a :class:`SharedMemory`, for one communicator.

    Every rank must make the same calls in the same order, as with any collective.
    """

    def __init__(self, shared: SharedMemory, rank: int, size: int) -> None:
        self._shared = shared
        self._rank = rank
        self._size = size
        self._half = shared.region_bytes // 2
        self._turn = 0  # which half of the regions the next segment uses; the same on every rank
        self._views: dict[tuple[str, str], list[list[Any]]] = {}

    def _halves(self, backend: ArrayBackend, like: Any) -> list[list[Any]]:
        """Per half, every rank's region as an array of ``like``'s dtype (made once per dtype)."""
        key = (backend.name, str(like.dtype))
        views = self._views.get(key)
        if views is None:
            views = [
                [backend.from_bytes(self._shared.region(r)[h * self._half : (h + 1) * self._half], like)
                 for r in range(self._size)]
                for h in (0, 1)
            ]  # fmt: skip
            self._views[key] = views
        return views

    def _next(self, views: list[list[Any]]) -> list[Any]:
        half = views[self._turn]
        self._turn ^= 1
        return half

    def _reduce(self, backend: ArrayBackend, op: ReduceOp, out: Any, parts: Sequence[Any]) -> None:
        """``out = parts[0] op parts[1] op ...``, in rank order, so every rank's bits agree."""
        if len(parts) == 1:
            backend.copy(out, parts[0])
            return
        backend.reduce_into(op, out, parts[0], parts[1])
        for part in parts[2:]:
            backend.combine(op, out, part)

    def allreduce(
        self, backend: ArrayBackend, out: Any, x: Any, op: ReduceOp, barrier: Barrier = unbounded
    ) -> None:
        """``out = op`` over every rank's ``x`` (1-D, of equal size); ``out`` may be ``x``."""
        views = self._halves(backend, x)
        count, size, rank = x.shape[0], self._size, self._rank
        itemsize = self._half // views[0][0].shape[0] if views[0][0].shape[0] else 1
        if count * itemsize <= min(SMALL_BYTES, self._half):
            half = self._next(views)
            backend.copy(half[rank][:count], x)
            barrier(self._shared, ())
            self._reduce(backend, op, out, [region[:count] for region in half])
            return
        share = bounds(tuple(count // size + (r < count % size) for r in range(size)))
        piece = views[0][0].shape[0] // size  # elements of each rank's share per segment
        for start in range(0, share[1] - share[0], piece):
            half = self._next(views)
            cuts = [(share[r] + start, min(share[r] + start + piece, share[r + 1])) for r in range(size)]
            mine = half[rank]
            for r, (lo, hi) in enumerate(cuts):
                if lo < hi:
                    backend.copy(mine[r * piece : r * piece + hi - lo], x[lo:hi])
            barrier(self._shared, ())
            lo, hi = cuts[rank]
            at = rank * piece
            if lo < hi:
                self._reduce(backend, op, out[lo:hi], [region[at : at + hi - lo] for region in half])
                backend.copy(mine[at : at + hi - lo], out[lo:hi])
            barrier(self._shared, ())
            for r, (lo, hi) in enumerate(cuts):
                if r != rank and lo < hi:
                    backend.copy(out[lo:hi], half[r][r * piece : r * piece + hi - lo])

    def reduce_scatter(
        self,
        backend: ArrayBackend,
        out: Any,
        x: Any,
        shares: Sequence[int],
        op: ReduceOp,
        barrier: Barrier = unbounded,
    ) -> None:
        """``out`` = this rank's share of ``op`` over every rank's ``x``, cut into ``shares``."""
        views = self._halves(backend, x)
        size, rank = self._size, self._rank
        edge = bounds(tuple(shares))
        piece = views[0][0].shape[0] // size
        for start in range(0, max(shares, default=0), piece):
            half = self._next(views)
            cuts = [
                (edge[r] + min(start, shares[r]), edge[r] + min(start + piece, shares[r]))
                for r in range(size)
            ]
            for r, (lo, hi) in enumerate(cuts):
                if lo < hi:
                    backend.copy(half[rank][r * piece : r * piece + hi - lo], x[lo:hi])
            barrier(self._shared, ())
            lo, hi = cuts[rank]
            at = rank * piece
            if lo < hi:
                target = out[lo - edge[rank] : hi - edge[rank]]
                self._reduce(backend, op, target, [region[at : at + hi - lo] for region in half])

    def allgather(
        self, backend: ArrayBackend, out: Any, x: Any, shares: Sequence[int], barrier: Barrier = unbounded
    ) -> None:
        """``out`` = every rank's ``x`` (``shares[r]`` elements) in rank order; ``x`` may lie in ``out``."""
        views = self._halves(backend, x)
        size, rank = self._size, self._rank
        edge = bounds(tuple(shares))
        piece = views[0][0].shape[0]
        for start in range(0, max(shares, default=0), piece):
            half = self._next(views)
            n = max(min(start + piece, shares[rank]) - start, 0)
            if n:
                backend.copy(half[rank][:n], x[start : start + n])
            barrier(self._shared, ())
            for r in range(size):
                m = max(min(start + piece, shares[r]) - start, 0)
                if m and r != rank:
                    backend.copy(out[edge[r] + start : edge[r] + start + m], half[r][:m])
            if n:
                backend.copy(out[edge[rank] + start : edge[rank] + start + n], half[rank][:n])
