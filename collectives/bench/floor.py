"""The machine's floor for an allreduce of private buffers: each rank reads what it must, once.

A rank owns a part of the buffer (about 1/P of it). It reads the peers' bytes of
its part straight out of their private memory (cross-memory attach,
``process_vm_readv``) a ``PIECE`` at a time, adds each piece into its own buffer
while the piece is in cache, and, once every part is reduced, reads the peers'
reduced parts back into its buffer. That is (P-1)/P of the buffer read from the
peers twice and nothing else: the fewest bytes any allreduce of buffers that
are not already shared can move. Three barriers order the phases (inputs
ready, parts reduced, parts read). Where the kernel forbids cross-memory attach
(a container without ``CAP_SYS_PTRACE`` and a strict Yama scope, another user's
processes), the floor is the one-copy path through a shared-memory window
instead: each rank copies its buffer in, reduces its part from the window, and
copies the reduced buffer out. Where both can run, the faster at the size at
hand is the floor (on a machine whose cache holds the buffer, the window's
copies cost less than the kernel's page pinning): ``Floor.method`` says which.

``python -m collectives bench floor`` is ``python -m collectives bench compare`` with this floor and the
MPI library's allreduce as the peers, from 64 KiB up.
"""

__all__ = ["CROSS_MEMORY", "DEFAULTS", "PIECE", "SHARED_WINDOW", "Floor", "cross_memory_error"]

import itertools
import os
from collections.abc import Callable
from typing import Any, cast

import numpy as np
from mpi4py import MPI

from collectives.transport.cross_memory import available, read

PIECE = 256 * 1024
"""Bytes read from a peer and added before the next read: well inside any L2."""
CROSS_MEMORY = "cross-memory attach (process_vm_readv)"
SHARED_WINDOW = "one copy through a shared-memory window"
DEFAULTS = ("-b", "64K", "-e", "64M", "-f", "4", "-a", "auto", "-p", "floor,mpi")
"""``bench floor`` is ``bench compare`` with these options first (any option of compare may follow)."""


def cross_memory_error(world: MPI.Intracomm) -> str | None:
    """Why cross-memory attach cannot run between these ranks, or ``None`` where it can; collective.

    Every rank reads a word of every other rank's memory; the answer is the same on every rank.
    """
    probe = np.array([world.rank + 1], np.int64)
    where = world.allgather((os.getpid(), probe.ctypes.data, MPI.Get_processor_name()))
    why = ""
    if not available():
        why = "this C library has no process_vm_readv"
    elif len({host for _, _, host in where}) > 1:
        why = "the ranks are on more than one node"
    else:
        scratch = np.zeros(1, np.int64)
        for peer, (pid, address, _) in enumerate(where):
            if peer == world.rank:
                continue
            try:
                read(pid, address, scratch.ctypes.data, scratch.nbytes)
            except OSError as error:
                why = str(error)
                break
            if scratch[0] != peer + 1:
                why = f"read {scratch[0]} from rank {peer}, which holds {peer + 1}"
                break
    reasons = [r for r in world.allgather(why) if r]
    return reasons[0] if reasons else None


def _fastest(x: np.ndarray, world: MPI.Intracomm) -> str:
    """The faster method for ``x`` on this machine, timed on a copy of it (the same on every rank)."""
    if world.size == 1 or cross_memory_error(world) is not None:
        return SHARED_WINDOW
    trial = np.zeros_like(x)
    seconds = []
    for method in (CROSS_MEMORY, SHARED_WINDOW):
        floor = Floor(trial, world, method)
        floor()  # page faults and first touches: not timed
        times = []
        for _ in range(3):
            world.Barrier()
            start = MPI.Wtime()
            floor()
            times.append(MPI.Wtime() - start)
        floor.free()
        seconds.append(world.allreduce(sorted(times)[1], op=MPI.MAX))
    return CROSS_MEMORY if seconds[0] <= seconds[1] else SHARED_WINDOW


def _parts(nbytes: int, itemsize: int, size: int) -> list[tuple[int, int]]:
    """Each rank's part as (first byte, end byte), whole elements, as even as they go."""
    count = nbytes // itemsize
    bounds = [count * r // size * itemsize for r in range(size + 1)]
    return list(itertools.pairwise(bounds))


class Floor:
    """The floor's in-place sum of ``x`` over ``world``'s ranks; call it as many times as needed.

    Collective to make (the ranks exchange where their buffers are) and to call.

    Attributes:
        method: :data:`CROSS_MEMORY` or :data:`SHARED_WINDOW`.
    """

    def __init__(self, x: np.ndarray, world: MPI.Intracomm, method: str | None = None) -> None:
        if not x.flags.c_contiguous:
            raise ValueError("the floor reduces a contiguous buffer")
        self.x, self.world = x, world
        self.bytes = x.reshape(-1).view(np.uint8)
        self.parts = _parts(x.nbytes, x.itemsize, world.size)
        if method is None:
            method = _fastest(x, world)
        self.method = method
        self.window: MPI.Win | None = None
        if world.size == 1:
            self._call: Callable[[], None] = lambda: None
        elif method == CROSS_MEMORY:
            self.peers = world.allgather((os.getpid(), x.ctypes.data))
            self.scratch = np.empty(PIECE // x.itemsize, x.dtype)
            self._call = self._cross_memory
        else:
            self.window = MPI.Win.Allocate_shared(x.nbytes, 1, comm=world)
            views = []
            for r in range(world.size):
                memory, _ = self.window.Shared_query(r)
                views.append(np.frombuffer(cast(Any, memory), np.uint8, x.nbytes))
            self.views = views
            self._call = self._shared_window

    def __call__(self) -> None:
        self._call()

    def free(self) -> None:
        """Free the shared-memory window, if any; collective."""
        if self.window is not None:
            self.window.Free()
            self.window = None

    def _add(self, target: np.ndarray, source: np.ndarray) -> None:
        np.add(target.view(self.x.dtype), source.view(self.x.dtype), out=target.view(self.x.dtype))

    def _cross_memory(self) -> None:
        world, rank = self.world, self.world.rank
        lo, hi = self.parts[rank]
        scratch = self.scratch.view(np.uint8)
        own = self.bytes
        base = own.ctypes.data
        world.Barrier()  # every rank's input is in place
        for start in range(lo, hi, scratch.nbytes):
            end = min(start + scratch.nbytes, hi)
            for peer, (pid, address) in enumerate(self.peers):
                if peer != rank:
                    read(pid, address + start, scratch.ctypes.data, end - start)
                    self._add(own[start:end], scratch[: end - start])
        world.Barrier()  # every part is reduced
        for peer, (pid, address) in enumerate(self.peers):
            start, end = self.parts[peer]
            if peer != rank and end > start:
                read(pid, address + start, base + start, end - start)
        world.Barrier()  # no rank changes its buffer while another still reads it

    def _shared_window(self) -> None:
        world, rank = self.world, self.world.rank
        lo, hi = self.parts[rank]
        mine = self.views[rank]
        np.copyto(mine, self.bytes)
        world.Barrier()
        for peer, view in enumerate(self.views):
            if peer != rank:
                self._add(mine[lo:hi], view[lo:hi])
        world.Barrier()
        for peer, view in enumerate(self.views):
            start, end = self.parts[peer]
            np.copyto(self.bytes[start:end], view[start:end])
        world.Barrier()
