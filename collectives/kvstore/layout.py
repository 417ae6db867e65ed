"""Where the store's keys live: roles of the ranks, partitions of a value, and the servers holding them."""

__all__ = ["DEFAULT_PARTITION_BYTES", "Partition", "Roles", "partition", "stable_hash"]

import hashlib
from dataclasses import dataclass

from ..chunking import bounds, even_split
from ..errors import ConfigurationError

DEFAULT_PARTITION_BYTES = 4 << 20
"""Bytes above which a value is cut into partitions spread over the servers (BytePS uses 4 MiB too)."""


@dataclass(frozen=True)
class Roles:
    """Which ranks of the store's communicator are workers and which are servers.

    Colocated (``dedicated == 0``): every rank is both, worker ``i`` and server
    ``i`` being rank ``i``. With ``dedicated = k`` servers the last ``k`` ranks
    serve and the others work, so worker ``i`` is still rank ``i``.
    """

    size: int
    dedicated: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.dedicated < self.size:
            raise ConfigurationError(
                f"servers={self.dedicated} leaves no worker among {self.size} ranks; "
                f"use 1 to {self.size - 1} dedicated servers, or None for colocated ones"
            )

    @property
    def num_workers(self) -> int:
        return self.size - self.dedicated

    @property
    def num_servers(self) -> int:
        return self.dedicated or self.size

    @property
    def server_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.num_workers, self.size)) if self.dedicated else tuple(range(self.size))

    @property
    def worker_ranks(self) -> tuple[int, ...]:
        return tuple(range(self.num_workers))

    def is_worker(self, rank: int) -> bool:
        return rank < self.num_workers

    def is_server(self, rank: int) -> bool:
        return not self.dedicated or rank >= self.num_workers


@dataclass(frozen=True)
class Partition:
    """Elements ``lo`` to ``hi`` of a key's flattened value, held by the server of rank ``server``."""

    index: int
    server: int
    lo: int
    hi: int


def stable_hash(key: object) -> int:
    """A hash of ``key`` that every process and every run agree on (Python's ``hash`` of a str is salted)."""
    text = f"{type(key).__name__}:{key}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little")


def partition(
    key: object, count: int, itemsize: int, servers: tuple[int, ...], partition_bytes: int, row: int = 1
) -> tuple[Partition, ...]:
    """Cut a value of ``count`` elements into partitions and place them on ``servers`` (ranks).

    A value of at most ``partition_bytes`` is one partition, on the server the
    :func:`stable_hash` of its key's text picks (so that ``3`` and ``"3"`` share
    a server, which can tell a worker that used one from one that used the other).
    A larger one is cut into ``ceil(bytes / partition_bytes)`` partitions of nearly
    equal size (whole rows of ``row`` elements each, so that a row of a 2-D value
    lives on one server); when there are at least as many partitions as servers,
    each server gets a run of consecutive partitions, in server order (so the value
    is split over the servers as a reduce-scatter splits it), and otherwise the run
    starts at the hashed server.
    """
    if partition_bytes < 1:
        raise ConfigurationError(f"partition_bytes must be positive, got {partition_bytes}")
    n = len(servers)
    rows = count // row if row else 0
    parts = max(1, min(-(-count * itemsize // partition_bytes), rows))
    start = 0 if parts >= n else stable_hash(str(key)) % n
    edges = bounds(even_split(rows, parts))
    return tuple(
        Partition(i, servers[(start + i * n // parts) % n], edges[i] * row, edges[i + 1] * row)
        for i in range(parts)
    )
