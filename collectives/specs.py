"""The contract of each collective: what every rank holds before and after, and its sizes."""

__all__ = [
    "COLLECTIVES",
    "SPECS",
    "CollectiveSpec",
    "Contribution",
    "ExactPattern",
    "Token",
    "check_root",
    "describe",
    "exact_pattern",
    "get_spec",
]

import operator
from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from itertools import pairwise

from .errors import InvalidRootError, ScheduleError
from .ops import ReduceOp, get_op
from .schedule import Schedule

Token = tuple[int, int]
"""``(rank, chunk)``: the input that ``rank`` started with in ``chunk``."""
Contribution = frozenset[Token] | None
"""The inputs combined into a chunk; ``None`` for no data."""
Condition = Callable[[int, int, int | None, int, int | None], Contribution]
"""``(rank, chunk, owner, world_size, root) -> contribution`` of a pre- or postcondition;
a postcondition's ``None`` leaves the chunk unchecked."""


@dataclass(frozen=True)
class CollectiveSpec:
    """What a collective guarantees, independent of the algorithm.

    Attributes:
        name: the collective's name.
        reduces: whether the collective combines inputs with an op.
        shared: whether each rank owns a share of the buffer (every chunk then
            has an owner) rather than all ranks holding the whole buffer.
        busbw_factor: algorithm bandwidth times this is the bus bandwidth, as
            nccl-tests reports it, for a world size.
        rooted: whether the data comes from or goes to one rank, the schedule's root.
        idempotent: whether a contribution may be combined into a chunk more
            than once; true of the barrier, whose chunks carry no data, only
            whom a rank has heard from.
        carries_data: false for the barrier: its chunks are tokens of one element.
        num_chunks: the number of chunks the layout fixes for a world size, if it does.
    """

    name: str
    reduces: bool
    shared: bool
    busbw_factor: Callable[[int], float]
    _before: Condition
    _after: Condition
    rooted: bool = False
    idempotent: bool = False
    carries_data: bool = True
    num_chunks: Callable[[int], int] | None = None

    def before(self, schedule: Schedule) -> list[list[Contribution]]:
        """The precondition: ``[rank][chunk]`` contributions every rank starts with."""
        self.check_layout(schedule)
        size, root = schedule.world_size, schedule.root
        return [
            [self._before(rank, chunk, _owner(schedule, chunk), size, root)
             for chunk in range(schedule.num_chunks)]
            for rank in range(size)
        ]  # fmt: skip

    def check_after(self, schedule: Schedule, state: list[list[Contribution]]) -> None:
        """Raise :class:`ScheduleError` at the first (rank, chunk) that breaks the postcondition."""
        size, root = schedule.world_size, schedule.root
        for rank, chunks in enumerate(state):
            for chunk, actual in enumerate(chunks):
                expected = self._after(rank, chunk, _owner(schedule, chunk), size, root)
                if expected is not None and actual != expected:
                    raise ScheduleError(
                        f"{schedule.name}: rank {rank} ends with chunk {chunk} holding "
                        f"{describe(actual, chunk)}, expected {describe(expected, chunk)}",
                        rank=rank,
                        chunk=chunk,
                        expected=expected,
                        actual=actual,
                    )

    def check_layout(self, schedule: Schedule) -> None:
        """Raise if the schedule is for another collective or its root, chunks or owners do not fit."""
        if schedule.collective != self.name:
            raise ScheduleError(f"{schedule.name} is a {schedule.collective} schedule, not {self.name}")
        if self.rooted and schedule.root is None:
            raise ScheduleError(f"{schedule.name}: a {self.name} schedule must name its root")
        if not self.rooted and schedule.root is not None:
            raise ScheduleError(
                f"{schedule.name}: {self.name} has no root, yet the schedule names {schedule.root}"
            )
        if self.num_chunks is not None and schedule.num_chunks != self.num_chunks(schedule.world_size):
            raise ScheduleError(
                f"{schedule.name}: a {self.name} schedule over {schedule.world_size} ranks has "
                f"{self.num_chunks(schedule.world_size)} chunks, not {schedule.num_chunks}"
            )
        if not self.carries_data and any(n != 1 for n in schedule.chunk_sizes):
            # the executor skips empty chunks, and a token needs no more than one element
            raise ScheduleError(
                f"{schedule.name}: {self.name} chunks hold one element each, not {schedule.chunk_sizes}"
            )
        if not self.shared:
            return
        owners = schedule.chunk_owner
        if owners is None:
            raise ScheduleError(f"{schedule.name}: a {self.name} schedule must give each chunk's owner")
        if any(a > b for a, b in pairwise(owners)):
            raise ScheduleError(
                f"{schedule.name}: chunk owners {owners} are not in rank order, so a rank's "
                "share would not be contiguous"
            )

    def shares(self, schedule: Schedule) -> tuple[int, ...]:
        """Elements of each rank's share of the buffer."""
        self.check_layout(schedule)
        sizes = [0] * schedule.world_size
        for chunk, owner in enumerate(schedule.chunk_owner or ()):
            sizes[owner] += schedule.chunk_sizes[chunk]
        return tuple(sizes)


def _owner(schedule: Schedule, chunk: int) -> int | None:
    return None if schedule.chunk_owner is None else schedule.chunk_owner[chunk]


def describe(contribution: Contribution, chunk: int) -> str:
    """Words for what a rank's ``chunk`` holds, for error messages."""
    if contribution is None:
        return "no data"
    if all(origin == chunk for _, origin in contribution):
        return "contributions of ranks {" + ", ".join(str(r) for r, _ in sorted(contribution)) + "}"
    return ", ".join(f"rank {r}'s chunk {c}" for r, c in sorted(contribution))


def _mine(rank: int, chunk: int) -> frozenset[Token]:
    return frozenset(((rank, chunk),))


def _everyone(world_size: int, chunk: int) -> frozenset[Token]:
    return frozenset((r, chunk) for r in range(world_size))


def _mine_if(rank: int | None, chunk: int) -> Contribution:
    return None if rank is None else _mine(rank, chunk)


def _ring_factor(world_size: int) -> float:
    return (world_size - 1) / world_size


def _alltoall_before(rank: int, chunk: int, owner: int | None, p: int, root: int | None) -> Contribution:
    if chunk < p:
        return _mine(rank, chunk)
    # the rank's share for itself, which the caller copies from input chunk ``rank``
    return _mine(rank, rank) if chunk == p + rank else None


# Every rank works on one buffer of the collective's full size, cut into chunks:
#   allreduce, reduce, broadcast: the whole array, chunked as the algorithm likes.
#   reduce_scatter, allgather, gather, scatter: the P shares in rank order, each chunk
#     inside one rank's share (chunk_owner), so every share is contiguous.
#   alltoall: 2P chunks of one share each. Chunk j of the input half (0..P-1) is the share
#     for rank j; chunk P + i of the output half is the share from rank i. No rank sends to
#     itself, so its share for itself starts in the output half, copied there beforehand.
#   barrier: one-element tokens that say whom a rank has heard from, combined by union.
SPECS: dict[str, CollectiveSpec] = {
    spec.name: spec
    for spec in (
        CollectiveSpec(
            "allreduce", reduces=True, shared=False,
            busbw_factor=lambda p: 2 * _ring_factor(p),
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk),
            _after=lambda rank, chunk, owner, p, root: _everyone(p, chunk),
        ),
        CollectiveSpec(
            "reduce_scatter", reduces=True, shared=True,
            busbw_factor=_ring_factor,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk),
            _after=lambda rank, chunk, owner, p, root: _everyone(p, chunk) if rank == owner else None,
        ),
        CollectiveSpec(
            "allgather", reduces=False, shared=True,
            busbw_factor=_ring_factor,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk) if rank == owner else None,
            _after=lambda rank, chunk, owner, p, root: _mine_if(owner, chunk),
        ),
        CollectiveSpec(
            "broadcast", reduces=False, shared=False, rooted=True,
            busbw_factor=lambda p: 1.0,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk) if rank == root else None,
            _after=lambda rank, chunk, owner, p, root: _mine_if(root, chunk),
        ),
        CollectiveSpec(
            "reduce", reduces=True, shared=False, rooted=True,
            busbw_factor=lambda p: 1.0,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk),
            _after=lambda rank, chunk, owner, p, root: _everyone(p, chunk) if rank == root else None,
        ),
        CollectiveSpec(
            "gather", reduces=False, shared=True, rooted=True,
            busbw_factor=_ring_factor,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk) if rank == owner else None,
            _after=lambda rank, chunk, owner, p, root: _mine_if(owner, chunk) if rank == root else None,
        ),
        CollectiveSpec(
            "scatter", reduces=False, shared=True, rooted=True,
            busbw_factor=_ring_factor,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk) if rank == root else None,
            _after=lambda rank, chunk, owner, p, root: _mine_if(root, chunk) if rank == owner else None,
        ),
        CollectiveSpec(
            "alltoall", reduces=False, shared=False,
            busbw_factor=_ring_factor,
            num_chunks=lambda p: 2 * p,
            _before=_alltoall_before,
            _after=lambda rank, chunk, owner, p, root: _mine(chunk - p, rank) if chunk >= p else None,
        ),
        CollectiveSpec(
            "barrier", reduces=True, shared=False, idempotent=True, carries_data=False,
            busbw_factor=lambda p: 0.0,
            _before=lambda rank, chunk, owner, p, root: _mine(rank, chunk),
            _after=lambda rank, chunk, owner, p, root: _everyone(p, chunk),
        ),
    )
}  # fmt: skip
COLLECTIVES = tuple(SPECS)


def check_root(root: int, world_size: int) -> int:
    """``root`` as an int, if it is a rank of a world of ``world_size`` ranks.

    Raises:
        InvalidRootError: it is not an integer (a bool is not), or outside ``0..world_size - 1``.
    """
    try:
        if isinstance(root, bool):  # an index, to Python, but never a rank meant as one
            raise TypeError
        rank = operator.index(root)
    except TypeError:
        raise InvalidRootError(f"root must be an integer rank, got {root!r}") from None
    if not 0 <= rank < world_size:
        raise InvalidRootError(f"root {rank} is not a rank: valid roots are 0..{world_size - 1}")
    return rank


def get_spec(collective: str) -> CollectiveSpec:
    """The spec of a collective by name; the error lists the known ones."""
    try:
        return SPECS[collective]
    except KeyError:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}") from None


_COMBINE: dict[str, Callable[[int, int], int]] = {
    "sum": operator.add,
    "prod": operator.mul,
    "min": min,
    "max": max,
    "band": operator.and_,
    "bor": operator.or_,
    "bxor": operator.xor,
}

_BITS = tuple(1 << k for k in range(7))
_PATTERN_VALUES: dict[str, tuple[int, ...]] = {
    "sum": (1, 2, 3, 0, 2),
    "min": (5, 3, 7, 1, 4, 6, 2),
    "max": (5, 3, 7, 1, 4, 6, 2),
    "band": tuple(127 ^ bit for bit in _BITS),
    "bor": _BITS,
    "bxor": _BITS,
}


@dataclass(frozen=True)
class ExactPattern:
    """Integer-valued inputs whose reduction is exact in every supported dtype.

    Rank ``r`` holds ``values[(i + r) % len(values)]`` at element ``i`` of its
    input; the combined result at element ``i`` is ``combined[i % len(values)]``
    (before ``avg`` divides by the world size). Exact for world sizes up to 42,
    where the largest sum, 3 * 42, still fits int8 and is exact in bfloat16.
    """

    values: tuple[int, ...]
    combined: tuple[int, ...]


def exact_pattern(op: "str | ReduceOp", world_size: int) -> ExactPattern:
    """The exact test pattern for ``op`` reduced over ``world_size`` ranks."""
    op = get_op(op)
    if op.combine == "prod":
        # one rank in each window of world_size contributes 2, the others 1
        values: tuple[int, ...] = (2,) + (1,) * world_size
    else:
        values = _PATTERN_VALUES[op.combine]
    period = len(values)
    combine = _COMBINE[op.combine]
    combined = tuple(
        reduce(combine, (values[(i + r) % period] for r in range(world_size))) for i in range(period)
    )
    return ExactPattern(values, combined)
