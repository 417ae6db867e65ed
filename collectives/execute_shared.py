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

The buffer goes through in segments of :data:`SEGMENT_BYTES` of every share,
small enough that a segment's copies and reduction stay in cache: each rank
copies into its region only the other owners' parts of the segment (its own
part it reads where it is), each owner reduces its part into its output and copies
it into a result slot of its region, and every rank copies the others' results out.
Measured at 2 ranks on a 2-core
machine (``bench/README.md``), whole halves of the region per segment went
through main memory three times and ran 1.3-1.5x slower than MPI at 16 MiB;
256 KiB segments ran at 0.6x (512 KiB since: see :data:`SEGMENT_BYTES`). The
regions are double-buffered: segment ``k`` uses half ``k mod 2`` of each region,
and the two barriers of a segment also order a half's reuse two segments later,
so a call needs no barrier at its end.

Buffers from :meth:`SharedExecutor.alloc` (``Communicator.alloc``) already lie in
shared memory, so with them the copy into the window is skipped: each owner
reduces its share reading the others' buffers, and every rank copies the shares
from the owners' buffers (per rank, S read and S / P written to reduce, and
(P - 1) / P S read and written to gather, against a further S read and written
to copy in through the window).
"""

__all__ = ["Barrier", "SharedExecutor"]

from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any

from .backends.base import ArrayBackend
from .chunking import bounds, even_split
from .errors import ConfigurationError, MismatchError
from .ops import ReduceOp
from .shared_sizes import SEGMENT_BYTES, WHOLE_SMALL_TOTAL_BYTES, small_bytes
from .transport.base import SharedMemory

Barrier = Callable[[SharedMemory, Sequence[int]], None]
"""Passes the next barrier of a shared memory, leaving a note (the watchdog bounds it by the deadline)."""


def unbounded(shared: SharedMemory, note: Sequence[int] = ()) -> None:
    """A barrier with no deadline."""
    shared.arrive(note)
    shared.wait()


_WINDOW, _ZERO_COPY = 0, 1  # how a rank runs a call, in the note of its first barrier
_SMALLS_KEPT = 64  # sizes of small allreduces whose views of the window are kept
_PIECE_BYTES = 1 << 17  # a zero-copy reduction goes through its share in pieces that stay in cache


class SharedExecutor:
    """Allreduce, reduce-scatter, all-gather, broadcast and reduce through a :class:`SharedMemory`.

    One per communicator (and one per node of a communicator over several). Every rank
    must make the same calls in the same order, as with any collective.
    """

    def __init__(
        self,
        shared: SharedMemory,
        rank: int,
        size: int,
        segment_bytes: int = SEGMENT_BYTES,
        small: int | None = None,
        rooted_segment_bytes: int | None = None,
        scatter_small: int | None = None,
    ) -> None:
        self._rank = rank
        self._size = size
        self._half = shared.region_bytes // 2
        self._segment_bytes = segment_bytes
        self.shared = shared
        """The memory it runs on."""
        self.turn = 0
        """Which half of the regions the next segment uses; the same on every rank."""
        self._views: dict[tuple[str, Any], list[list[Any]]] = {}
        self._allocations: list[list[memoryview]] = []  # from alloc: every rank's part of each
        self._bases: list[int | None] = []  # the address of this rank's part of each
        self._scratches: dict[tuple[str, Any], Any] = {}
        # each rank's input bytes up to which an allreduce passes one barrier (small_bytes)
        self._small_bytes = min(small_bytes(size, compiled=False) if small is None else small, self._half)
        # an op that combines every rank's part at once costs more than a copy: each rank of a
        # one-barrier call would combine all of it, an owner of a segmented one only its share
        # (at 2 ranks the pair op's window stays where it was measured: 512 KiB a rank)
        whole = (1 << 20 if size <= 2 else WHOLE_SMALL_TOTAL_BYTES) // size
        self._whole_small_bytes = min(whole, self._small_bytes)
        # a reduce-scatter's (scatter_small_bytes; the allreduce's where not given)
        self._scatter_small = min(self._small_bytes if scatter_small is None else scatter_small, self._half)
        # per (backend, dtype, count, half): this rank's part of the half and every rank's, as arrays
        self._smalls: dict[tuple[str, Any, int, int], tuple[Any, list[Any]]] = {}
        self.segment_fits = min(segment_bytes, self._half)
        """Bytes of each rank's share one segment of an all-gather takes through the window."""
        rooted = segment_bytes if rooted_segment_bytes is None else rooted_segment_bytes
        self.rooted_fits = min(rooted, self._half)
        """Bytes of a broadcast's or reduce's whole buffer one segment takes through the window."""

    def reset(self) -> None:
        """Start again from the first half of the regions; every rank at once, between calls.

        For a call whose ranks disagreed on its signature: some may have run segments and others
        none, so their turns differ. The barrier that found it came after every read of an earlier
        call, so any half is free."""
        self.turn = 0

    def small_views(self, backend: ArrayBackend, like: Any) -> tuple[tuple[Any, list[Any]], ...]:
        """Per half: this rank's part and every rank's, as arrays of ``like``'s dtype and size.

        What a one-barrier call copies ``like`` into, for a caller that runs such calls itself (the
        compiled engine's): it takes the half :attr:`turn` names and flips it, as the executor does.
        """
        count = like.shape[0]
        halves = self._halves(backend, like)
        return tuple((half[self._rank][:count], [region[:count] for region in half]) for half in halves)

    def small_call(self, backend: ArrayBackend, like: Any, op: str, spin_s: float, *mode: Any) -> Any:
        """The compiled engine's one-barrier call over :meth:`small_views` for arrays like ``like``
        (``SharedMemory.small_kernel``: ``op`` a binary op's name, ``mode`` its mode, share and root),
        or None where the engine takes none."""
        regions = tuple(every for _, every in self.small_views(backend, like))
        return self.shared.small_kernel(regions, str(like.dtype), op, like.shape[0], spin_s, *mode)

    def _halves(self, backend: ArrayBackend, like: Any) -> list[list[Any]]:
        """Per half, every rank's region as an array of ``like``'s dtype (made once per dtype)."""
        key = (backend.name, like.dtype)
        views = self._views.get(key)
        if views is None:
            views = [
                [backend.from_bytes(self.shared.region(r)[h * self._half : (h + 1) * self._half], like)
                 for r in range(self._size)]
                for h in (0, 1)
            ]  # fmt: skip
            self._views[key] = views
        return views

    def alloc(self, nbytes: int) -> memoryview:
        """This rank's part of a new shared allocation of ``nbytes``; collective (``Communicator.alloc``)."""
        parts = self.shared.allocate(nbytes)
        self._allocations.append(parts)
        self._bases.append(_address(parts[self._rank]))
        return parts[self._rank]

    def _locate(self, array: Any) -> tuple[int, int] | None:
        """``(allocation number from 1, byte offset)`` of ``array`` in this rank's allocations, or None."""
        if not self._bases:
            return None  # no allocations: skip reading the address, a microsecond a call
        address = _address(array)
        if address is None:
            return None
        end = address + array.nbytes
        for i, base in enumerate(self._bases):
            if base is not None and base <= address and end <= base + len(self._allocations[i][self._rank]):
                return i + 1, address - base
        return None

    def _peer_arrays(
        self, backend: ArrayBackend, mine: Any, notes: list[tuple[int, ...]], at: int
    ) -> list[Any]:
        """Every rank's array like ``mine``, found by ``(allocation, offset)`` at ``at`` in its note."""
        arrays = []
        for r, note in enumerate(notes):
            if r == self._rank:
                arrays.append(mine)
                continue
            number, offset = note[at : at + 2]
            memory = self._allocations[number - 1][r]
            arrays.append(backend.from_bytes(memory[offset : offset + mine.nbytes], mine))
        return arrays

    def _agree(self, barrier: Barrier, note: Sequence[int]) -> list[tuple[int, ...]]:
        """Pass the call's first barrier leaving ``note``; every rank's note (see :meth:`agreed_notes`)."""
        barrier(self.shared, note)
        return self.agreed_notes(note)

    def agreed_notes(self, note: Sequence[int] = (_WINDOW,)) -> list[tuple[int, ...]]:
        """Every rank's note of the barrier just passed, this rank's ``note``: the same mode on every rank.

        Raises:
            MismatchError: on every rank, when some passed Communicator.alloc buffers and some did not.
        """
        notes = [tuple(note) if r == self._rank else self.shared.note(r) for r in range(self._size)]
        modes = [n[0] for n in notes]
        if len(set(modes)) > 1:
            shared = tuple(r for r, m in enumerate(modes) if m != _WINDOW)
            others = tuple(r for r, m in enumerate(modes) if m == _WINDOW)
            raise MismatchError(
                f"ranks {shared} passed buffers from Communicator.alloc in place and ranks {others} did not; "
                "every rank must do the same",
                {"buffer": {"alloc": shared, "other": others}},
            )
        return notes

    def _reduce_pieces(
        self, backend: ArrayBackend, op: ReduceOp, out: Any, parts: Sequence[Any], scratch: Any
    ) -> None:
        """``out = parts[0] op ...`` in rank order, a cache-sized piece at a time, through ``scratch``.

        ``out`` may be one of ``parts``: each piece is reduced into ``scratch`` and
        copied out, so no part is overwritten before it is read, and for P > 2 the
        partial sums stay in cache instead of going through memory P - 1 times.
        """
        step = scratch.shape[0]
        for lo in range(0, out.shape[0], step):
            hi = min(lo + step, out.shape[0])
            piece = scratch[: hi - lo]
            self.reduce(backend, op, piece, [part[lo:hi] for part in parts])
            backend.copy(out[lo:hi], piece)

    def _slot(self, views: list[list[Any]], slots: int) -> int:
        """Elements of one slot of a segment, with ``slots`` slots in each half of a region.

        Raises:
            ConfigurationError: if the regions cannot hold one element per slot.
        """
        elements: int = views[0][0].shape[0]
        item: int = views[0][0].itemsize
        slot = min(max(self._segment_bytes // item, 1), elements // slots)
        if slot < 1:
            raise ConfigurationError(
                f"shared-memory regions of {self.shared.region_bytes} bytes are too small for "
                f"{slots} slots of {item}-byte elements per half"
            )
        return slot

    def _next(self, views: list[list[Any]]) -> list[Any]:
        half = views[self.turn]
        self.turn ^= 1
        return half

    def reduce(self, backend: ArrayBackend, op: ReduceOp, out: Any, parts: Sequence[Any]) -> None:
        """``out = parts[0] op parts[1] op ...``, in rank order, so every rank's bits agree."""
        if len(parts) == 1:
            backend.copy(out, parts[0])
            return
        if op.whole:  # not a combination of two: every rank's part at once
            op.apply_all(out, parts)
            return
        backend.reduce_into(op, out, parts[0], parts[1])
        for part in parts[2:]:
            backend.combine(op, out, part)

    def allreduce(
        self, backend: ArrayBackend, out: Any, x: Any, op: ReduceOp, barrier: Barrier = unbounded
    ) -> None:
        """``out = op`` over every rank's ``x`` (1-D, of equal size); ``out`` may be ``x``.

        Where ``out`` and ``x`` lie in allocations of :meth:`alloc` on every rank, the
        owners read the inputs where they are and the result goes straight to the
        others' ``out``: three barriers, and no copy through the window.
        """
        count = x.shape[0]
        if count * x.itemsize <= self._limit(op):  # all inputs together within the small total
            regions = self._through_window(backend, x, barrier)
            self.reduce(backend, op, out, regions)
            return
        views = self._halves(backend, x)
        size, rank = self._size, self._rank
        share = _even_shares(count, size)
        source, target = self._locate(x), self._locate(out)
        if source is not None and target is not None:
            self._next(views)  # as the window path does, so the ranks' turns agree even on a mismatch
            notes = self._agree(barrier, (_ZERO_COPY, *source, *target))
            inputs = self._peer_arrays(backend, x, notes, 1)
            outputs = self._peer_arrays(backend, out, notes, 3)
            lo, hi = share[rank], share[rank + 1]
            self._reduce_pieces(
                backend, op, out[lo:hi], [a[lo:hi] for a in inputs], self._scratch(backend, x)
            )
            barrier(self.shared, ())  # every share reduced
            for r in range(size):
                lo, hi = share[r], share[r + 1]
                if r != rank and lo < hi:
                    backend.copy(out[lo:hi], outputs[r][lo:hi])
            barrier(self.shared, ())  # no one reads this rank's buffers now: they are the caller's again
            return
        slot = self._slot(views, size + 1)
        result = size * slot  # where each owner leaves its reduced part for the others
        in_place = backend.shares_memory(out, x)  # the dispatch passes out apart from x, or x itself
        for start in range(0, share[1] - share[0], slot):
            half = self._next(views)
            cuts = [(share[r] + start, min(share[r] + start + slot, share[r + 1])) for r in range(size)]
            lo, hi = cuts[rank]
            # into out, then copied into the slot, as _engine.c does (OWNER_BLOCK_BYTES says why)
            self._reduce_segment(backend, op, x, half, cuts, slot, start == 0, barrier, out[lo:hi], in_place)
            if lo < hi and size > 1:
                backend.copy(half[rank][result : result + hi - lo], out[lo:hi])
            barrier(self.shared, ())
            for r, (lo, hi) in enumerate(cuts):
                if lo < hi and r != rank:
                    backend.copy(out[lo:hi], half[r][result : result + hi - lo])

    def segmented_kernel(self, backend: ArrayBackend, like: Any, op: str, spin_s: float) -> Any:
        """The compiled engine's twin of :meth:`allreduce`'s window path for arrays like ``like``, or None.

        The same barriers with the same notes, so a rank running it meets one on the Python path
        (:meth:`through_window`: whether a call takes it); the caller keeps its ``turn`` as :attr:`turn`."""
        views = self._halves(backend, like)
        slot = self._slot(views, self._size + 1)
        halves = [[self.shared.region(r)[h * self._half : (h + 1) * self._half] for r in range(self._size)]
                  for h in (0, 1)]  # fmt: skip
        bounds = _even_shares(like.shape[0], self._size)
        return self.shared.segmented_kernel(halves, str(like.dtype), op, bounds, slot, spin_s)

    def through_window(self, out: Any, x: Any) -> bool:
        """Whether :meth:`allreduce` of ``x`` into ``out`` goes through the window (not zero-copy)."""
        return self._locate(x) is None or self._locate(out) is None

    def small(self, nbytes: int, op: ReduceOp, scatter: bool = False) -> bool:
        """Whether an allreduce (or ``scatter``: a reduce-scatter) of ``nbytes`` a rank passes one barrier.

        At most the executor's window a rank (:func:`small_bytes`, given it; for an op that is ``whole``
        at more than two ranks, :data:`WHOLE_SMALL_TOTAL_BYTES` in all); a reduce-scatter's
        (:func:`~collectives.shared_sizes.scatter_small_bytes`, given it) but for a ``whole`` op.
        """
        return nbytes <= (self._scatter_small if scatter and not op.whole else self._limit(op))

    def _limit(self, op: ReduceOp) -> int:
        return self._whole_small_bytes if op.whole else self._small_bytes

    def allreduce_small(
        self, backend: ArrayBackend, out: Any, x: Any, op: ReduceOp, barrier: Barrier = unbounded
    ) -> None:
        """:meth:`allreduce` for a call :meth:`small` admits: one copy in, one barrier, one reduction.

        The repeated calls' entry (:mod:`collectives.lean`): what :meth:`allreduce`
        does for such a call, without choosing its path.
        """
        turn = self.turn
        self.turn = turn ^ 1
        small = self._smalls.get((backend.name, x.dtype, x.shape[0], turn))
        if small is None:
            self.turn = turn
            regions = self._through_window(backend, x, barrier)
        else:
            small[0][...] = x  # 1-D arrays of one shape: the assignment costs a third of backend.copy
            barrier(self.shared, ())
            regions = small[1]
            if len(regions) == 2:  # the common case inline: a call less than _reduce
                backend.reduce_apart(op, out, regions[0], regions[1])  # the window's, and the caller's
                return
        self.reduce(backend, op, out, regions)

    def _through_window(self, backend: ArrayBackend, x: Any, barrier: Barrier) -> list[Any]:
        """Copy all of ``x`` into the next half of this rank's region and pass a barrier; every rank's copy.

        For calls whose inputs together are small: one barrier, and each rank reads
        what it needs of the others' where it lies. The views are kept per size.
        """
        mine, regions = self._window(backend, x, x.shape[0])
        backend.copy(mine, x)
        barrier(self.shared, ())  # no note: every rank of a call this small goes through the window
        return regions

    def _window(self, backend: ArrayBackend, like: Any, count: int) -> tuple[Any, list[Any]]:
        """The next half's first ``count`` elements of this rank's region and every rank's (kept per size)."""
        turn = self.turn
        self.turn = turn ^ 1
        key = (backend.name, like.dtype, count, turn)
        small = self._smalls.get(key)
        if small is None:
            regions = [region[:count] for region in self._halves(backend, like)[turn]]
            small = self._smalls[key] = (regions[self._rank], regions)
            if len(self._smalls) > _SMALLS_KEPT:
                self._smalls.clear()  # start afresh rather than evict one by one
                self._smalls[key] = small
        return small

    def reduce_scatter(
        self,
        backend: ArrayBackend,
        out: Any,
        x: Any,
        shares: Sequence[int],
        op: ReduceOp,
        barrier: Barrier = unbounded,
    ) -> None:
        """``out`` = this rank's share of ``op`` over every rank's ``x``, cut into ``shares``.

        Where ``x`` lies in an allocation of :meth:`alloc` on every rank, each rank
        reduces its share reading the others' ``x`` where it is: two barriers, no copy.
        Where all ranks' ``x`` together are small, each copies its ``x`` in whole, as
        :meth:`allreduce` does: one barrier.
        """
        size, rank = self._size, self._rank
        edge = bounds(tuple(shares))
        if not any(shares):
            return
        if self.small(x.shape[0] * x.itemsize, op, scatter=True):  # one barrier, x copied whole
            regions = self._through_window(backend, x, barrier)
            lo, hi = edge[rank], edge[rank + 1]
            self.reduce(backend, op, out, [region[lo:hi] for region in regions])
            return
        views = self._halves(backend, x)
        source = self._locate(x)
        if source is not None:
            self._next(views)  # as the window path does, so the ranks' turns agree even on a mismatch
            notes = self._agree(barrier, (_ZERO_COPY, *source))
            inputs = self._peer_arrays(backend, x, notes, 1)
            lo, hi = edge[rank], edge[rank + 1]
            self._reduce_pieces(backend, op, out, [a[lo:hi] for a in inputs], self._scratch(backend, x))
            barrier(self.shared, ())  # no one reads this rank's x any more
            return
        slot = self._slot(views, size + 1)
        aliased = backend.shares_memory(out, x)  # then reduced apart, in the result slot, and copied
        for start in range(0, max(shares), slot):
            half = self._next(views)
            cuts = [
                (edge[r] + min(start, shares[r]), edge[r] + min(start + slot, shares[r])) for r in range(size)
            ]
            lo, hi = cuts[rank]
            target = out[lo - edge[rank] : hi - edge[rank]]
            into = half[rank][size * slot : size * slot + hi - lo] if aliased else target
            self._reduce_segment(backend, op, x, half, cuts, slot, start == 0, barrier, into, False)
            if aliased and lo < hi:
                backend.copy(target, into)

    def _reduce_segment(
        self,
        backend: ArrayBackend,
        op: ReduceOp,
        x: Any,
        half: list[Any],
        cuts: Sequence[tuple[int, int]],
        slot: int,
        first: bool,
        barrier: Barrier,
        target: Any,
        in_place: bool,
    ) -> None:
        """One segment of a reduce-scatter through ``half`` of the regions, reduced into ``target``.

        Copies its part ``cuts[r]`` of ``x`` into slot ``r`` of its region for every other
        owner ``r``, passes the barrier (``first`` agrees on the mode), and reduces its part
        from ``x`` and the others' slots. ``in_place`` (``target`` is that part of ``x``), a
        reduction that would overwrite it before reading it reads a copy in its own slot.
        """
        size, rank = self._size, self._rank
        mine = half[rank]
        for r, (lo, hi) in enumerate(cuts):
            if r != rank and lo < hi:
                backend.copy(mine[r * slot : r * slot + hi - lo], x[lo:hi])
        if first:
            self._agree(barrier, (_WINDOW,))
        else:
            barrier(self.shared, ())
        lo, hi = cuts[rank]
        if lo < hi:
            at = rank * slot
            own = x[lo:hi]
            if in_place and size > 1 and (rank >= 2 or op.whole):
                own = mine[at : at + hi - lo]
                backend.copy(own, x[lo:hi])
            parts = [own if r == rank else half[r][at : at + hi - lo] for r in range(size)]
            self.reduce(backend, op, target, parts)

    def _scratch(self, backend: ArrayBackend, like: Any) -> Any:
        """A cache-sized buffer of ``like``'s dtype for :meth:`_reduce_pieces` (made once per dtype)."""
        key = (backend.name, like.dtype)
        scratch = self._scratches.get(key)
        if scratch is None:
            scratch = backend.empty(max(_PIECE_BYTES // like.itemsize, 1), like)
            self._scratches[key] = scratch
        return scratch

    def allgather(
        self, backend: ArrayBackend, out: Any, x: Any, shares: Sequence[int], barrier: Barrier = unbounded
    ) -> None:
        """``out`` = every rank's ``x`` (``shares[r]`` elements) in rank order; ``x`` may lie in ``out``."""
        size, rank = self._size, self._rank
        share, edge = shares[0], bounds(tuple(shares))
        own, at = out[edge[rank] : edge[rank + 1]], _address(x)
        apart = at is None or at != _address(own)  # else x is this rank's part of out: in place
        if 0 < share * x.itemsize <= self.segment_fits and shares.count(share) == size:
            # one segment of equal shares: the loop below, on views kept per size
            mine, regions = self._window(backend, x, share)
            backend.copy(mine, x)
            if apart:  # this rank's part from x, in cache, not from its copy
                backend.copy(own, x)
            barrier(self.shared, ())
            for r, region in enumerate(regions):
                if r != rank:
                    backend.copy(out[r * share : (r + 1) * share], region)
            return
        views = self._halves(backend, x)
        slot = self._slot(views, 1)
        for start in range(0, max(shares, default=0), slot):
            half = self._next(views)
            n = max(min(start + slot, shares[rank]) - start, 0)
            if n:
                backend.copy(half[rank][:n], x[start : start + n])
            if n and apart:
                backend.copy(own[start : start + n], x[start : start + n])
            barrier(self.shared, ())
            for r in range(size):
                m = max(min(start + slot, shares[r]) - start, 0)
                if m and r != rank:
                    backend.copy(out[edge[r] + start : edge[r] + start + m], half[r][:m])

    def barrier(self, barrier: Barrier = unbounded) -> None:
        """Pass one barrier: a barrier collective's whole call (a turn of the window taken, as the engine)."""
        self.turn ^= 1
        barrier(self.shared, ())

    def broadcast(self, backend: ArrayBackend, work: Any, root: int, barrier: Barrier = unbounded) -> None:
        """``work`` = the root's ``work`` everywhere: the root copies it in, a barrier, the others copy out.

        In segments of a half of the root's region, a barrier each, the halves taken by
        :attr:`turn` as :meth:`allgather` takes them: a half is written again two barriers
        later, once every rank has read it, so a call needs no barrier at its end.
        """
        at_root, count = self._rank == root, work.shape[0]
        slot = max(self.rooted_fits // work.itemsize, 1)
        for start in range(0, count, slot):
            n = min(slot, count - start)
            region = self._window(backend, work, n)[1][root]
            if at_root:
                backend.copy(region, work[start : start + n])
            barrier(self.shared, ())
            if not at_root:
                backend.copy(work[start : start + n], region)

    def reduce_to(
        self, backend: ArrayBackend, out: Any, x: Any, op: ReduceOp, root: int, barrier: Barrier = unbounded
    ) -> None:
        """At the root, ``out`` = ``op`` over every rank's ``x`` in rank order; ``out`` may be ``x``.

        The other ranks copy their ``x`` into their regions, pass a barrier, and the root
        combines every rank's part where it lies (its own in ``x``) with :meth:`reduce`, so
        the bits are the shared-memory allreduce's. In segments as :meth:`broadcast`.
        """
        rank, count = self._rank, x.shape[0]
        # out over x: each piece reduced apart and copied in, so no part is overwritten before it is read
        scratch = self._scratch(backend, x) if rank == root and backend.shares_memory(out, x) else None
        slot = max(self.rooted_fits // x.itemsize, 1)
        for start in range(0, count, slot):
            n = min(slot, count - start)
            mine, regions = self._window(backend, x, n)
            if rank != root:
                backend.copy(mine, x[start : start + n])
            barrier(self.shared, ())
            if rank == root:
                parts = [x[start : start + n] if r == root else part for r, part in enumerate(regions)]
                if scratch is None:
                    self.reduce(backend, op, out[start : start + n], parts)
                else:
                    self._reduce_pieces(backend, op, out[start : start + n], parts, scratch)


@lru_cache(maxsize=256)
def _even_shares(count: int, size: int) -> tuple[int, ...]:
    """Where each of ``size`` owners' shares of ``count`` elements starts, then ``count``; even shares."""
    return bounds(even_split(count, size))


def _address(array: Any) -> int | None:
    """Where ``array``'s data starts in this process's memory; ``None`` if it cannot tell."""
    if isinstance(array, memoryview):
        import numpy as np  # only the numpy backend reaches the shared-memory executor

        array = np.frombuffer(array, np.uint8)
    interface = getattr(array, "__array_interface__", None)
    return None if interface is None else int(interface["data"][0])
