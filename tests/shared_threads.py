"""Shared memory between threads of one process, to run the shared-memory executor at any rank count."""

import math
import threading
from collections.abc import Callable, Sequence
from typing import Any

from collectives.transport.base import SharedMemory


class ThreadWorld:
    """``size`` ranks' regions in this process and one barrier they share; :meth:`memory` is a rank's view."""

    def __init__(self, size: int, region_bytes: int) -> None:
        self.size = size
        self.region_bytes = region_bytes
        self.regions = [bytearray(region_bytes) for _ in range(size)]
        self.arrived = [0] * size
        self.notes = [[(0,) * SharedMemory.NOTE_INTS] * 2 for _ in range(size)]  # by the barrier's parity
        self.messages = [[bytearray(ThreadSharedMemory.MESSAGE_BYTES) for _ in (0, 1)] for _ in range(size)]
        self.condition = threading.Condition()

    def memory(self, rank: int) -> "ThreadSharedMemory":
        return ThreadSharedMemory(self, rank)

    def run(self, work: Callable[[int, "ThreadSharedMemory"], Any]) -> list[Any]:
        """``work(rank, memory)`` on one thread per rank; their results in rank order (errors re-raised)."""
        results: list[Any] = [None] * self.size
        errors: list[BaseException] = []

        def one(rank: int) -> None:
            try:
                results[rank] = work(rank, self.memory(rank))
            except BaseException as error:  # re-raised on the caller's thread below
                errors.append(error)
                with self.condition:
                    self.arrived[rank] = -1  # the others stop waiting for this rank
                    self.condition.notify_all()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        if errors:
            raise errors[0]
        if any(thread.is_alive() for thread in threads):
            raise TimeoutError("a rank's thread did not finish in 60 s")
        return results


class ThreadSharedMemory(SharedMemory):
    """One rank's view of a :class:`ThreadWorld`."""

    MESSAGE_BYTES = 256

    def __init__(self, world: ThreadWorld, rank: int) -> None:
        self._world = world
        self._rank = rank
        self._number = 0

    @property
    def region_bytes(self) -> int:
        return self._world.region_bytes

    def region(self, rank: int) -> memoryview:
        return memoryview(self._world.regions[rank])

    def arrive(self, note: Sequence[int] = ()) -> None:
        world = self._world
        self._number += 1
        with world.condition:
            if note:  # as MPISharedMemory: by parity, so a peer still reading the last note finds it
                world.notes[self._rank][self._number & 1] = tuple(note) + (0,) * (self.NOTE_INTS - len(note))
            world.arrived[self._rank] = self._number
            world.condition.notify_all()

    def wait(self, timeout: float = math.inf) -> list[int]:
        world = self._world

        def missing() -> list[int]:
            if -1 in world.arrived:
                raise RuntimeError("a peer thread failed")
            return [r for r, n in enumerate(world.arrived) if n < self._number]

        with world.condition:
            world.condition.wait_for(lambda: not missing(), None if math.isinf(timeout) else timeout)
            return missing()

    def post(self, message: bytes | bytearray | memoryview) -> None:
        self._world.messages[self._rank][(self._number + 1) & 1][: len(message)] = message

    def message(self, rank: int) -> memoryview:
        return memoryview(self._world.messages[rank][self._number & 1])

    def note(self, rank: int) -> tuple[int, ...]:
        return self._world.notes[rank][self._number & 1]
