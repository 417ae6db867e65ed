"""The schedule data model: transfers of chunks between ranks, step by step."""

__all__ = ["RankProgram", "RankStep", "Schedule", "Step", "Transfer", "schedule_name", "share_schedule"]

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from .chunking import bounds
from .errors import ScheduleError


@dataclass(frozen=True)
class Transfer:
    """Rank ``src`` sends its copy of ``chunk`` to rank ``dst``.

    The receiver stores it at chunk ``dst_chunk`` of its buffer, the same chunk
    when that is ``None`` (a different one lets alltoall move rank i's chunk j
    to rank j's chunk i). With ``reduce`` the receiver combines the incoming
    chunk into its own copy with the collective's op; without it the receiver's
    copy is overwritten.
    """

    src: int
    dst: int
    chunk: int
    reduce: bool = False
    dst_chunk: int | None = None

    @property
    def into(self) -> int:
        """The receiver's chunk the transfer lands in."""
        return self.chunk if self.dst_chunk is None else self.dst_chunk


@dataclass(frozen=True)
class Step:
    """One round of independent transfers.

    Every send of a step reads the chunk as it was when the step began; the
    receives land when all transfers of the step are done, reductions applied in
    the order the transfers are listed (which makes results deterministic).
    """

    transfers: tuple[Transfer, ...]

    def __init__(self, transfers: Iterable[Transfer]) -> None:
        object.__setattr__(self, "transfers", tuple(transfers))


@dataclass(frozen=True)
class RankStep:
    """One rank's part of a step: what it sends and what it receives, in schedule order."""

    sends: tuple[Transfer, ...]
    recvs: tuple[Transfer, ...]


class _Chunks:
    """What a buffer cut into ``chunk_sizes`` gives a schedule and a rank's program alike."""

    chunk_sizes: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_sizes)

    @cached_property
    def chunk_bounds(self) -> tuple[int, ...]:
        """Element offset of each chunk in the buffer, plus the buffer's length."""
        return bounds(self.chunk_sizes)

    @property
    def count(self) -> int:
        """Elements in each rank's buffer."""
        return self.chunk_bounds[-1]

    def chunk_range(self, chunk: int) -> tuple[int, int]:
        """``(start, stop)`` element offsets of ``chunk`` in the buffer."""
        return self.chunk_bounds[chunk], self.chunk_bounds[chunk + 1]


@dataclass(frozen=True)
class Schedule(_Chunks):
    """A collective's algorithm for one world size and buffer layout, in the global view.

    Every rank holds a buffer of ``sum(chunk_sizes)`` elements cut into chunks
    of ``chunk_sizes`` elements, in order. Each rank's sends and receives are
    derived from the one list of transfers, so the two sides of a message
    cannot disagree.

    Attributes:
        name: the algorithm with its parameters, e.g. ``allreduce-ring(n=8)``.
        collective: the collective's name, e.g. ``allreduce`` or ``broadcast``.
        world_size: the number of ranks.
        chunk_sizes: elements per chunk.
        steps: the rounds of transfers.
        chunk_owner: for collectives where each rank has a share of the buffer
            (reduce_scatter, allgather, gather, scatter), the rank whose share
            each chunk is part of.
        root: for rooted collectives (broadcast, reduce, gather, scatter), the
            rank the data comes from or goes to.
    """

    name: str
    collective: str
    world_size: int
    chunk_sizes: tuple[int, ...]
    steps: tuple[Step, ...]
    chunk_owner: tuple[int, ...] | None = None
    root: int | None = None
    _programs: dict[int, tuple[RankStep, ...]] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    @classmethod
    def named(
        cls,
        collective: str,
        algorithm: str,
        world_size: int,
        chunk_sizes: Iterable[int],
        steps: Iterable[Step],
        *,
        root: int | None = None,
        chunk_owner: Iterable[int] | None = None,
    ) -> "Schedule":
        """The schedule of ``steps`` over chunks of ``chunk_sizes``, named by :func:`schedule_name`."""
        return cls(
            name=schedule_name(collective, algorithm, world_size, root),
            collective=collective,
            world_size=world_size,
            chunk_sizes=tuple(chunk_sizes),
            steps=tuple(steps),
            chunk_owner=None if chunk_owner is None else tuple(chunk_owner),
            root=root,
        )

    def __post_init__(self) -> None:
        self._check_structure()

    def program(self, rank: int) -> tuple[RankStep, ...]:
        """The sends and receives of ``rank`` at every step (memoized)."""
        program = self._programs.get(rank)
        if program is None:
            if not 0 <= rank < self.world_size:
                raise ScheduleError(f"rank {rank} is outside world size {self.world_size}")
            program = tuple(
                RankStep(
                    sends=tuple(t for t in step.transfers if t.src == rank),
                    recvs=tuple(t for t in step.transfers if t.dst == rank),
                )
                for step in self.steps
            )
            self._programs[rank] = program
        return program

    def rank_program(self, rank: int) -> "RankProgram":
        """``rank``'s part as a :class:`RankProgram`, projected from the global steps."""
        crowded: set[tuple[int, int]] = set()
        for index, step in enumerate(self.steps):
            reducers: dict[int, set[int]] = {}
            for t in step.transfers:
                if t.reduce:
                    reducers.setdefault(t.dst, set()).add(t.src)
            crowded.update(
                (index, t.dst)
                for t in step.transfers
                if t.src == rank and t.reduce and len(reducers[t.dst]) > 1
            )
        return RankProgram(
            name=self.name,
            collective=self.collective,
            world_size=self.world_size,
            rank=rank,
            chunk_sizes=self.chunk_sizes,
            steps=self.program(rank),
            chunk_owner=self.chunk_owner,
            root=self.root,
            crowded=frozenset(crowded),
        )

    def to_json(self) -> str:
        """The schedule as JSON; each transfer is ``[src, dst, chunk, reduce]`` plus ``dst_chunk`` if set."""
        steps = [
            [
                [t.src, t.dst, t.chunk, int(t.reduce), *(() if t.dst_chunk is None else (t.dst_chunk,))]
                for t in step.transfers
            ]
            for step in self.steps
        ]
        return json.dumps(
            {
                "name": self.name,
                "collective": self.collective,
                "world_size": self.world_size,
                "chunk_sizes": list(self.chunk_sizes),
                "chunk_owner": None if self.chunk_owner is None else list(self.chunk_owner),
                "root": self.root,
                "steps": steps,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> "Schedule":
        """A schedule from :meth:`to_json`'s output, checked like any other."""
        data = json.loads(text)
        owner = data.get("chunk_owner")
        return cls(
            name=data["name"],
            collective=data["collective"],
            world_size=data["world_size"],
            chunk_sizes=tuple(data["chunk_sizes"]),
            steps=tuple(
                Step(
                    Transfer(src, dst, chunk, bool(reduce), *into) for src, dst, chunk, reduce, *into in step
                )
                for step in data["steps"]
            ),
            chunk_owner=None if owner is None else tuple(owner),
            root=data.get("root"),
        )

    def _check_structure(self) -> None:
        size = self.world_size
        if size < 1:
            raise ScheduleError(f"{self.name}: world size must be at least 1, got {size}")
        if any(n < 0 for n in self.chunk_sizes):
            raise ScheduleError(f"{self.name}: negative chunk size in {self.chunk_sizes}")
        if self.chunk_owner is not None:
            if len(self.chunk_owner) != self.num_chunks:
                raise ScheduleError(
                    f"{self.name}: {len(self.chunk_owner)} chunk owners for {self.num_chunks} chunks"
                )
            if any(not 0 <= r < size for r in self.chunk_owner):
                raise ScheduleError(f"{self.name}: chunk owner outside 0..{size - 1}")
        if self.root is not None and not 0 <= self.root < size:
            raise ScheduleError(f"{self.name}: root {self.root} outside 0..{size - 1}", rank=self.root)
        for index, step in enumerate(self.steps):
            copied: set[tuple[int, int]] = set()
            reduced: set[tuple[int, int]] = set()
            sent: set[tuple[int, int]] = set()
            for t in step.transfers:
                where = dict(step=index, chunk=t.chunk)
                if not (0 <= t.src < size and 0 <= t.dst < size):
                    raise ScheduleError(
                        f"{self.name}: step {index}: transfer {t.src}->{t.dst} names a rank "
                        f"outside 0..{size - 1}",
                        **where,
                    )
                if t.src == t.dst:
                    raise ScheduleError(
                        f"{self.name}: step {index}: rank {t.src} sends chunk {t.chunk} to itself",
                        rank=t.src,
                        **where,
                    )
                for chunk in (t.chunk, t.into):
                    if not 0 <= chunk < self.num_chunks:
                        raise ScheduleError(
                            f"{self.name}: step {index}: chunk {chunk} outside 0..{self.num_chunks - 1}",
                            **where,
                        )
                if self.chunk_sizes[t.chunk] != self.chunk_sizes[t.into]:
                    raise ScheduleError(
                        f"{self.name}: step {index}: chunk {t.chunk} of {self.chunk_sizes[t.chunk]} "
                        f"elements lands in chunk {t.into} of {self.chunk_sizes[t.into]}",
                        **where,
                    )
                target = (t.dst, t.into)
                if target in copied or (not t.reduce and (target in reduced or target in sent)):
                    raise ScheduleError(
                        f"{self.name}: step {index}: rank {t.dst} overwrites chunk {t.into} "
                        "while also receiving or sending it in the same step",
                        rank=t.dst,
                        step=index,
                        chunk=t.into,
                    )
                if (t.src, t.chunk) in copied:
                    raise ScheduleError(
                        f"{self.name}: step {index}: rank {t.src} sends chunk {t.chunk} "
                        "while it is being overwritten in the same step",
                        rank=t.src,
                        **where,
                    )
                (reduced if t.reduce else copied).add(target)
                sent.add((t.src, t.chunk))


@dataclass(frozen=True)
class RankProgram(_Chunks):
    """One rank's part of a schedule, as an algorithm builds it without the other ranks' transfers.

    Its fields are the :class:`Schedule`'s, but ``steps`` holds only this rank's
    part of each step, what :meth:`Schedule.program` projects; and ``crowded``
    says what the rank cannot see of its peers' parts and the executor needs: the
    ``(step, peer)`` pairs where the peer reduces what this rank sends it together
    with what other ranks send it in that step (so a message to it is not merged
    from adjacent chunks, whose contributions must be added in schedule order).
    Built by :func:`collectives.algorithms.rank_program`.
    """

    name: str
    collective: str
    world_size: int
    rank: int
    chunk_sizes: tuple[int, ...]
    steps: tuple[RankStep, ...]
    chunk_owner: tuple[int, ...] | None = None
    root: int | None = None
    crowded: frozenset[tuple[int, int]] = frozenset()

    @classmethod
    def named(
        cls,
        collective: str,
        algorithm: str,
        world_size: int,
        chunk_sizes: Iterable[int],
        steps: Iterable[RankStep],
        *,
        rank: int,
        root: int | None = None,
        chunk_owner: Iterable[int] | None = None,
        crowded: frozenset[tuple[int, int]] = frozenset(),
    ) -> "RankProgram":
        """Rank ``rank``'s part of :meth:`Schedule.named`'s schedule: ``steps``, its part of each step."""
        return cls(
            name=schedule_name(collective, algorithm, world_size, root),
            collective=collective,
            world_size=world_size,
            rank=rank,
            chunk_sizes=tuple(chunk_sizes),
            steps=tuple(steps),
            chunk_owner=None if chunk_owner is None else tuple(chunk_owner),
            root=root,
            crowded=crowded,
        )


def schedule_name(collective: str, algorithm: str, world_size: int, root: int | None = None) -> str:
    """A schedule's name, and its rank programs': ``<collective>-<algorithm>(n=<ranks>)``.

    A rooted one adds ``, root=<root>``: ``allreduce-ring(n=8)``, ``broadcast-ring(n=4, root=1)``.
    """
    rooted = "" if root is None else f", root={root}"
    return f"{collective}-{algorithm}(n={world_size}{rooted})"


def share_schedule(
    collective: str, algorithm: str, shares: Sequence[int], steps: Iterable[Step], root: int | None = None
) -> Schedule:
    """The schedule of ``steps`` where chunk ``r`` is rank ``r``'s share of ``shares[r]`` elements.

    For the collectives where each rank owns a share of the buffer (reduce-scatter,
    all-gather, gather, scatter).
    """
    size = len(shares)
    return Schedule.named(collective, algorithm, size, shares, steps, root=root, chunk_owner=range(size))
