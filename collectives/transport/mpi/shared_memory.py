"""One node's shared memory over MPI-3 shared windows: regions, a bounded barrier, notes and messages."""

__all__ = ["ORDERED_STORES", "SHARED_REGION_BYTES", "SPIN_POLLS", "MPISharedMemory", "spin_polls"]

import atexit
import contextlib
import functools
import math
import os
import platform
import sys
import time
import weakref
from array import array
from collections.abc import Sequence
from typing import Any

from mpi4py import MPI

from ... import engine
from ...errors import TransportError
from ..base import SharedMemory
from .failures import failed_ranks, ulfm_missing

SHARED_REGION_BYTES = 1 << 24
"""Bytes of each rank's region of the shared window: two segments of 8 MiB, double-buffered.

Each segment is a barrier or two, and on a busy node a barrier costs as much as
moving megabytes (measured: 1 MiB segments made a 16 MiB allreduce 3.7 times
slower than 8 MiB ones on 2 loaded cores), so segments are large rather than
small enough for a core's cache.
"""

_HEADER_BYTES = 128  # of a rank's slot in the control window: its barrier number, then its notes by parity
_LEAVING_INT = 13  # the header's integer set once the rank came to free the windows
_DECISION_INT = 14  # rank 0's header only: whether the windows are freed, decided once by compare-and-swap
_BROKEN_INT = 15  # the header's last integer: > 0 once the rank broke off, -1 once it timed out (time_out)
_MESSAGE_BYTES = 256
_LITTLE_ENDIAN = sys.byteorder == "little"  # a packed signature's sequence number is little-endian
_DIGEST_WORD = _MESSAGE_BYTES // 8 - 1  # a message's last 8 bytes: the digest of a posted signature
_SLOT_BYTES = _HEADER_BYTES + 2 * _MESSAGE_BYTES  # then its messages by parity; its own cache lines

EXIT_WAIT_S = 5.0
"""How long a rank whose barrier timed out waits at exit for the missing ranks to be leaving too."""

_NUMBER, _PASSED, _SIGNED = 0, 1, 2  # the barrier state's words (MPISharedMemory._state)
_FREE, _KEEP = 1, 2  # the decision on the windows (0: not yet decided)
SPIN_POLLS = 64
"""Polls of a barrier before a waiting rank yields its core, where the node's ranks each have one.

Measured at 2 ranks on 2 cores, 8 B allreduce: 3.4 against 3.8 us a call (MPICH 1.7); at 4 ranks
on 2 cores spinning first took 2-4x longer, so an oversubscribed node yields at once.
"""

ENGINE_SPIN_SCALE = 16
"""The compiled engine's polls before it may yield, as a multiple of :data:`SPIN_POLLS` (none stays none).

A poll in C costs a few nanoseconds against the interpreter's hundred, so the engine's
64 polls yielded the core before a peer a microsecond behind arrived (8 B ``p()`` at 2 ranks
on 2 cores: 1.26-1.28 us at 1x, 1.04-1.06 us at 16x, 64x and 256x alike). Past these polls
the engine spins on for a time it adapts (``meeting_pass`` in ``_engine.c``: up to 20 us while
the peers come within it, halving down to 1 us where they come later), then yields.
"""

BROKEN_FREE_WAIT_S = 2.0
"""How long a rank whose communicator broke (or whose peer broke it) waits for the others in :meth:`free`.

A broken communicator's peers may never come to free it (dead, hung, or gone on
elsewhere), so such a rank waits only this long, not the whole timeout, before
keeping the windows.
"""


ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
"""Whether this processor keeps stores in order and loads in order (x86's total store order).

There a rank's data is visible to a peer that saw its barrier number (stored after
the data), and the peer's loads of the data come after its load of the number, so the
barrier needs no ``Win.Sync`` fences (four of them cost 0.3 us of a 3.4 us 8 B allreduce);
elsewhere (Arm, POWER) it fences as MPI's unified memory model asks.
"""


def spin_polls(node_ranks: int) -> int:
    """How many polls a barrier spins before yielding: none where a node's ranks outnumber its cores.

    There a spinning rank holds the core a late peer needs to arrive.
    """
    return SPIN_POLLS if node_ranks <= (os.cpu_count() or 1) else 0


class MPISharedMemory(SharedMemory):
    """An MPI-3 shared window (``Win.Allocate_shared``) over the ranks of one node.

    Ranks keep a passive epoch open on the windows for their whole life. The
    barrier is not ``MPI_Barrier`` (which cannot be bounded, and measured 150 to
    400 us on a busy node against 2 to 15 us for this): each rank has a slot in
    a small control window, and arriving is writing its note, then the barrier's
    number into its slot; waiting polls the others' numbers (a few times, then
    yielding the core between polls: :func:`spin_polls`). Off x86, ``Win.Sync``
    fences go before the note and the number (so the rank's stores are visible) and
    after the wait (so loads see what the others stored); x86 keeps that order
    itself (:data:`ORDERED_STORES`). Notes and posted
    messages alternate between two places by the barrier's parity, so a rank that
    is a barrier ahead does not overwrite what a slower one is still reading.
    """

    MESSAGE_BYTES = _MESSAGE_BYTES - 8  # the last 8 bytes hold a signature's digest (post_signature)

    def __init__(self, node: MPI.Intracomm, region_bytes: int, host_ranks: int = 0) -> None:
        self._node = node
        self._bytes = region_bytes
        size, rank = node.Get_size(), node.Get_rank()
        self._win = MPI.Win.Allocate_shared(region_bytes, 1, comm=node)
        self._regions = [memoryview(self._win.Shared_query(r)[0]).cast("B") for r in range(size)]  # type: ignore[arg-type]
        # rank 0 holds every slot, one cache line each, so arrivals do not contend for a line
        self._control = MPI.Win.Allocate_shared(_SLOT_BYTES * size if rank == 0 else 0, 1, comm=node)
        control = memoryview(self._control.Shared_query(0)[0]).cast("B")  # type: ignore[arg-type]
        self._messages = [
            [control[r * _SLOT_BYTES + _HEADER_BYTES + p * _MESSAGE_BYTES :][:_MESSAGE_BYTES] for p in (0, 1)]
            for r in range(size)
        ]
        self._rank = rank
        # barrier numbers and notes as Python ints: reading and writing them costs less than through numpy
        self._numbers = control.cast("q")
        self._stride = _SLOT_BYTES // 8
        self._others = [r for r in range(size) if r != rank]
        self._slots = [r * self._stride for r in self._others]  # where each other rank's number is
        self._spin = spin_polls(max(size, host_ranks))  # emulated nodes share one machine's cores
        # each rank's messages by parity, as indices of their first word in the int64 view
        self._message_words = [
            [(r * _SLOT_BYTES + _HEADER_BYTES + p * _MESSAGE_BYTES) // 8 for p in (0, 1)] for r in range(size)
        ]
        self._peer_words = [[self._message_words[r][p] for r in self._others] for p in (0, 1)]
        self._own_words = self._message_words[rank]
        self._own_slot = rank * self._stride
        # the barrier's state, in words the compiled engine reads and writes too (small_kernel): the
        # number of the last barrier arrived at, of the last passed, and by parity the digest of the
        # signature this rank's message holds (0: none)
        self._state = array("q", [0, 0, 0, 0])
        self._fence = not ORDERED_STORES
        self._signed: Any = None  # the engine's signed barrier (False: none), made by the first pass_signed
        self._signed_timeout = 0.0  # the wait it was made for
        if rank == 0:
            control[:] = bytes(len(control))
        self._win.Lock_all(MPI.MODE_NOCHECK)
        self._control.Lock_all(MPI.MODE_NOCHECK)
        node.Barrier()  # the slots are zero before anyone arrives
        self._windows: list[MPI.Win] = []
        self._abandoned = False
        self._freed = False  # the windows are gone: nothing may read them, at exit neither
        if not _LIVE:
            atexit.register(_leave_all)  # before mpi4py's MPI_Finalize
        _LIVE.add(self)
        self._ulfm = ulfm_missing() is None  # then a dead rank ends a barrier's wait at once

    @property
    def region_bytes(self) -> int:
        return self._bytes

    def region(self, rank: int) -> memoryview:
        return self._regions[rank]

    def arrive(self, note: Sequence[int] = ()) -> None:
        state = self._state
        number = state[_NUMBER]
        if state[_PASSED] != number:
            raise RuntimeError("arrive called before the previous barrier was passed")
        number += 1
        state[_NUMBER] = number
        fence = self._fence
        if fence:
            self._win.Sync()
        if note:
            # by the barrier's parity: a peer may still read the note of the barrier before this one
            at = self._rank * self._stride + 1 + (number & 1) * self.NOTE_INTS
            numbers = self._numbers
            for i, value in enumerate(note):
                numbers[at + i] = value
            for i in range(len(note), self.NOTE_INTS):
                numbers[at + i] = 0
        if fence:
            self._control.Sync()
        self._numbers[self._own_slot] = number

    def _missing(self, number: int) -> list[int]:
        numbers, stride = self._numbers, self._stride
        return [r for r in self._others if numbers[r * stride] < number]

    def wait(self, timeout: float = math.inf) -> list[int]:
        number = self._state[_NUMBER]
        numbers = self._numbers
        for slot in self._slots:  # inline: most waits find everyone there, in a few microseconds a call
            if numbers[slot] < number:
                if missing := self._await(number, timeout):
                    return missing
                break
        if self._fence:
            self._control.Sync()
            self._win.Sync()
        self._state[_PASSED] = number
        return []

    def _await(self, number: int, timeout: float) -> list[int]:
        """Poll until every rank arrived at barrier ``number`` or ``timeout`` passed; the ranks missing."""
        deadline = time.monotonic() + timeout
        polls = 0
        while missing := self._missing(number):
            polls += 1
            if time.monotonic() >= deadline or (polls & 255 == 0 and self._given_up()):
                return missing
            if polls > self._spin:
                os.sched_yield()
        return []

    def pass_signed(self, packed: bytearray, digest: int, sequence: int, timeout: float) -> bool | None:
        signed = self._signed
        if signed is None:  # the compiled engine's, made for the first call's wait (the lean paths')
            made = self._kernel("SignedBarrier", "uint8", "bor", timeout)
            signed = self._signed = False if made is None else made()
            self._signed_timeout = timeout
        if signed is False or timeout != self._signed_timeout:
            return self._pass_signed_here(packed, digest, sequence, timeout)
        return signed.pass_signed(packed, digest, sequence)  # type: ignore[no-any-return]

    def _pass_signed_here(self, packed: bytearray, digest: int, sequence: int, timeout: float) -> bool | None:
        # post_signature, arrive and wait inline: a repeated small call's whole barrier in one Python call
        if self._fence or not _LITTLE_ENDIAN:
            return super().pass_signed(packed, digest, sequence, timeout)
        state = self._state
        number = state[_NUMBER]
        if state[_PASSED] != number:
            raise RuntimeError("arrive called before the previous barrier was passed")
        number += 1
        parity = number & 1
        numbers = self._numbers
        at = self._own_words[parity]
        if state[_SIGNED + parity] == digest:
            numbers[at] = sequence
        else:
            self._messages[self._rank][parity][: len(packed)] = packed
            numbers[at + _DIGEST_WORD] = digest
            state[_SIGNED + parity] = digest
        state[_NUMBER] = number
        numbers[self._own_slot] = number
        for slot in self._slots:
            if numbers[slot] < number:
                if self._await(number, timeout):
                    return None
                break
        state[_PASSED] = number
        for at in self._peer_words[parity]:
            if numbers[at] != sequence or numbers[at + _DIGEST_WORD] != digest:
                return False
        return True

    def small_kernel(
        self,
        halves: tuple[Sequence[Any], ...],
        dtype: str,
        op: str,
        count: int,
        spin_s: float,
        mode: int = 0,
        share: tuple[int, int] | None = None,
        root: int = 0,
    ) -> Any:
        made = self._kernel("SmallAllreduce", dtype, op, spin_s)
        lo, hi = (0, count) if share is None else share
        return made and made(regions=halves, count=count, mode=mode, lo=lo, hi=hi, root=root)

    def segmented_kernel(
        self,
        halves: Sequence[Sequence[Any]],
        dtype: str,
        op: str,
        bounds: Sequence[int],
        slot: int,
        spin_s: float,
    ) -> Any:
        made = self._kernel("SegmentedAllreduce", dtype, op, spin_s)
        size = len(self._message_words)
        notes = [[r * self._stride + 1 + parity * self.NOTE_INTS for r in range(size)] for parity in (0, 1)]
        return made and made(notes=notes, note_ints=self.NOTE_INTS, halves=halves, bounds=bounds, slot=slot)

    def _kernel(self, kind: str, dtype: str, op: str, spin_s: float) -> Any:
        """A maker of the engine's ``kind`` of call on this memory's barrier, given the rest; or None.

        None where the engine does not run or reduce ``dtype`` with ``op`` (or on a
        big-endian machine, whose packed signatures the engine does not read).
        """
        if engine.COMPILED is None or not _LITTLE_ENDIAN or not engine.reduces(dtype, op):
            return None
        size = len(self._message_words)
        meeting = (
            self._numbers,  # the control window
            self._state,
            [r * self._stride for r in range(size)],  # every rank's barrier number
            [[self._message_words[r][parity] for r in range(size)] for parity in (0, 1)],  # posted signatures
            _DIGEST_WORD,
            self.MESSAGE_BYTES,
            self._rank,
            dtype,
            op,
            self._spin * ENGINE_SPIN_SCALE,
            spin_s,
        )
        return functools.partial(getattr(engine.COMPILED, kind), meeting=meeting)

    def _given_up(self) -> bool:
        """Whether a peer broke off: no use waiting. Raises TransportError if a rank died (ULFM)."""
        broken = self.broken_by() is not None
        if broken or not self._ulfm:
            return broken
        with contextlib.suppress(MPI.Exception):  # MPI learns of a death only inside its calls
            self._node.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        dead = failed_ranks(self._node)
        if not dead:
            return False
        named = MPI.Group.Translate_ranks(self._node.Get_group(), list(dead), MPI.COMM_WORLD.Get_group())
        raise TransportError(
            f"MPI says rank {', '.join(map(str, named))} of MPI.COMM_WORLD died (ULFM), "
            "so a shared-memory barrier cannot be passed"
        )

    def post(self, message: bytes | bytearray | memoryview) -> None:
        parity = (self._state[_NUMBER] + 1) & 1
        self._messages[self._rank][parity][: len(message)] = message
        if self._state[_SIGNED + parity]:  # no digest stands for this message: peers compare it whole
            self._numbers[self._own_words[parity] + _DIGEST_WORD] = 0
            self._state[_SIGNED + parity] = 0

    def post_signature(self, packed: bytearray, digest: int, sequence: int) -> None:
        if not _LITTLE_ENDIAN:  # the sequence number's word would not read as its packed bytes
            self.post(packed)
            return
        parity = (self._state[_NUMBER] + 1) & 1
        at = self._own_words[parity]
        numbers = self._numbers
        if self._state[_SIGNED + parity] == digest:  # the rest of the signature is there from the last post
            numbers[at] = sequence
            return
        self._messages[self._rank][parity][: len(packed)] = packed
        numbers[at + _DIGEST_WORD] = digest
        self._state[_SIGNED + parity] = digest

    def signatures_match(self, packed: bytearray, digest: int, sequence: int) -> bool:
        if not _LITTLE_ENDIAN:
            return False
        numbers = self._numbers
        for at in self._peer_words[self._state[_PASSED] & 1]:
            if numbers[at] != sequence or numbers[at + _DIGEST_WORD] != digest:
                return False
        return True

    def message(self, rank: int) -> memoryview:
        return self._messages[rank][self._state[_PASSED] & 1]

    def note(self, rank: int) -> tuple[int, ...]:
        at = rank * self._stride + 1 + (self._state[_PASSED] & 1) * self.NOTE_INTS
        return tuple(self._numbers[at : at + self.NOTE_INTS])

    def allocate(self, nbytes: int) -> list[memoryview]:
        win = MPI.Win.Allocate_shared(nbytes, 1, comm=self._node)
        win.Lock_all(MPI.MODE_NOCHECK)
        self._windows.append(win)
        return [memoryview(win.Shared_query(r)[0]).cast("B") for r in range(self._node.Get_size())]  # type: ignore[arg-type]

    def break_off(self, rank: int) -> None:
        self._numbers[self._rank * self._stride + _BROKEN_INT] = rank + 1

    def broken_by(self) -> int | None:
        numbers, stride = self._numbers, self._stride  # > 0: broken off (< 0: timed out, time_out)
        return next(
            (numbers[at] - 1 for r in self._others if (numbers[at := r * stride + _BROKEN_INT]) > 0), None
        )

    def time_out(self) -> None:
        at = self._rank * self._stride + _BROKEN_INT
        if not self._numbers[at]:  # a break's mark says more
            self._numbers[at] = -1

    def timed_out_by(self) -> int | None:
        numbers, stride = self._numbers, self._stride
        return next((r for r in self._others if numbers[r * stride + _BROKEN_INT] < 0), None)

    def abandon(self) -> None:
        # the ranks that never arrived would leave MPI_Finalize waiting for them forever
        # (measured: a survivor's exit hangs while a peer sleeps), so end the job at exit
        if not self._abandoned:
            self._abandoned = True
            atexit.register(self._abort_if_missing)  # runs before mpi4py's own MPI_Finalize

    def _abort_if_missing(self) -> None:
        """At exit, after a barrier timed out: abort the job unless every rank is leaving too.

        This rank is in no barrier any more, so it says it is leaving; the ranks that
        never came to the barrier get :data:`EXIT_WAIT_S` to be leaving as well (an
        early exit, or a :meth:`free`), as only a rank stuck for good would leave
        MPI_Finalize waiting.
        """
        if self._freed or MPI.Is_finalized():
            return  # freed windows cannot be read; and every rank came to free them
        self.leave()
        deadline = time.monotonic() + EXIT_WAIT_S
        while self._missing(self._state[_NUMBER]) and not self._all_leaving():
            if time.monotonic() >= deadline:
                break
            time.sleep(1e-3)
            self._control.Sync()
        else:
            return
        print(
            "collectives: a shared-memory barrier timed out waiting for ranks that never came; "
            "MPI_Finalize would wait for them forever, so the job is aborted",
            file=sys.stderr,
            flush=True,
        )
        MPI.COMM_WORLD.Abort(1)

    def leave(self) -> None:
        """Say this rank leaves without freeing the windows (the process ends): a peer's free keeps them."""
        if self._freed:
            return
        self._decide(_KEEP)  # first: a peer's free() must not take this rank's leaving for its coming
        self._numbers[self._rank * self._stride + _LEAVING_INT] = 1
        self._control.Sync()

    def forsake(self) -> None:
        """Drop the at-exit abort for ranks that never came: they died, and the survivors went on (ULFM)."""
        _LIVE.discard(self)
        if self._abandoned:
            atexit.unregister(self._abort_if_missing)
        self._abandoned = True

    def free(self, timeout: float = math.inf, broken: bool = False) -> bool:
        """Release the windows and the node's communicator where every rank comes to do so in time.

        ``MPI_Win_free`` is collective and cannot be bounded: a rank that never
        calls it (dead, hung, gone on after a timeout) would leave the others in it
        for good. So the ranks first meet through the control window, and the
        first rank to decide, by an atomic compare-and-swap on one word, decides
        for all: free (every rank came) or keep (one gave up waiting). A rank that
        came goes on to do what was decided, so either every rank frees the windows
        or none does; kept, they are leaked until the process ends (MPICH and Open
        MPI release them at exit), which costs memory, never a hang.

        Args:
            timeout: the longest wait for the other ranks, in seconds.
            broken: whether this rank's communicator broke; then (as where a peer
                broke it) it waits at most :data:`BROKEN_FREE_WAIT_S`.

        Returns:
            Whether the windows were freed.
        """
        if self._freed:
            return True
        numbers, stride = self._numbers, self._stride
        numbers[self._rank * stride + _LEAVING_INT] = 1
        self._control.Sync()
        start = time.monotonic()
        wait = min(timeout, BROKEN_FREE_WAIT_S) if broken else timeout
        pause = 1e-5
        while not (everyone := self._all_leaving()):
            now = time.monotonic()
            if self.broken_by() is not None:
                wait = min(wait, BROKEN_FREE_WAIT_S)
            if now - start >= wait:
                break
            time.sleep(pause)  # waits up to seconds for ranks still finishing: no core taken
            pause = min(2 * pause, 1e-3)
            self._control.Sync()
        if self._decide(_FREE if everyone else _KEEP) != _FREE:
            return False
        self._freed = True
        _LIVE.discard(self)
        if self._abandoned:
            atexit.unregister(self._abort_if_missing)
        self._regions = []
        self._messages = []
        self._numbers = memoryview(bytearray(0)).cast("q")
        for win in (self._win, self._control):
            win.Unlock_all()
            win.Free()
        # the allocations' windows stay: arrays from Communicator.alloc may still point into them
        # (every rank keeps them alike, as every rank allocated them); they go with the process
        self._node.Free()
        return True

    def _all_leaving(self) -> bool:
        numbers, stride = self._numbers, self._stride
        return all(numbers[r * stride + _LEAVING_INT] for r in self._others)

    def _decide(self, proposal: int) -> int:
        """``proposal`` if this rank decides first, else what was decided (one atomic compare-and-swap)."""
        mine, unset, found = array("q", [proposal]), array("q", [0]), array("q", [0])
        try:
            self._control.Compare_and_swap(
                [mine, MPI.INT64_T], [unset, MPI.INT64_T], [found, MPI.INT64_T], 0, _DECISION_INT * 8
            )
            self._control.Flush(0)
        except MPI.Exception:  # a dead rank (ULFM): no collective free is possible
            return _KEEP
        return found[0] or proposal


_LIVE: "weakref.WeakSet[MPISharedMemory]" = weakref.WeakSet()  # windows not yet freed nor forsaken


def _leave_all() -> None:
    """At exit, every window still held says its rank is leaving, so the peers' free() keeps it."""
    if not MPI.Is_finalized():
        for shared in list(_LIVE):
            with contextlib.suppress(MPI.Exception):
                shared.leave()
