"""Runs one rank's part of a schedule over a transport, on an array backend."""

__all__ = [
    "DEFAULT_SEGMENT_BYTES",
    "PLANS_BUDGET",
    "PLANS_KEPT",
    "ProgramPlan",
    "Scratch",
    "clear_plans",
    "execute",
    "opening",
    "pack_opening",
    "plan",
    "program_plan",
    "run",
    "scratch_elements",
]

import weakref
from collections import Counter
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

from .backends.base import ArrayBackend
from .memo import Bounded
from .ops import ReduceOp
from .schedule import RankProgram, Schedule
from .tracing.recorder import TRACER as _TRACE
from .tracing.steps import StepTracer
from .transport.base import Transport
from .transport.tags import Tag

_TAG = Tag.DATA  # a module global: every message of run's loop reads it

DEFAULT_SEGMENT_BYTES = 1 << 22
"""Bytes per segment of a reduced message: the reduction of one segment overlaps the
transfer of the next. Chosen by measurement (``python -m bench.segments``: ring
allreduce, float32, shuffled interleaved rounds, medians): against 256 KiB, 4 MiB
segments took 0.79-0.93 of the time at 1-64 MiB on 2 ranks and 0.83-1.04 on 4;
1 MiB and whole messages were within a few percent of 4 MiB, 32-128 KiB were
1.1-2.7 times slower (each segment costs a Python round of posting and waiting)."""


@dataclass(frozen=True, slots=True)
class _Message:
    """One message of a rank's step: elements ``lo:hi`` of the buffer, to or from ``peer``.

    A send reads the source (the caller's input, untouched so far) where ``fresh``,
    else the buffer. A receive with ``landing >= 0`` lands in scratch at that offset
    and is then reduced into ``lo:hi`` (from the source where ``fresh``); otherwise it
    lands in the buffer directly. A reduction puts the lower rank's operand first
    (``first``: the received one), so that two ranks combining the same two partial
    results (a butterfly's partners) get the same bits, ±0 and NaN payloads included.
    """

    peer: int
    lo: int
    hi: int
    fresh: bool
    landing: int
    # the only message between its two ranks in its direction and step (both ends agree)
    lone: bool = False
    # a reduced receive from a lower rank: op(received, own) rather than op(own, received)
    first: bool = False


@dataclass(frozen=True, slots=True)
class _StepPlan:
    prefill: tuple[tuple[int, int], ...]  # ranges copied from the source before the step
    recvs: tuple[_Message, ...]
    sends: tuple[_Message, ...]
    reduces: bool
    # a reduction overlaps a send of the same step, so it must wait for the sends
    reduce_after_sends: bool
    first: bool = False  # the schedule's first step


@dataclass(frozen=True)
class ProgramPlan:
    """A rank's part of a schedule, ready to post: every message's range, peer and landing.

    Consecutive transfers of a step between the same two ranks whose chunks are
    adjacent on both sides travel as one message; reduced messages are cut into
    segments so that reducing one overlaps receiving the next. Built once per
    (schedule, rank, segment, whether a separate source is read) and cached.

    Attributes:
        steps: the rank's steps, empty ones left out.
        scratch: elements of scratch the plan needs.
        untouched: element ranges the schedule never writes on this rank, copied from
            the source at the end when there is a separate one.
    """

    steps: tuple[_StepPlan, ...]
    scratch: int
    untouched: tuple[tuple[int, int], ...]

    @cached_property
    def size(self) -> int:
        """Steps, messages and ranges the plan holds: what keeping it costs, in those units."""
        return len(self.untouched) + sum(1 + len(s.prefill) + len(s.recvs) + len(s.sends) for s in self.steps)


class Scratch:
    """Scratch buffers kept between calls, one per array library, dtype and device.

    A communicator owns one, so repeated collectives allocate nothing: a buffer is
    replaced only by a larger one, when a call needs more than any before.
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str, str], Any] = {}

    def get(self, backend: ArrayBackend, count: int, like: Any) -> Any:
        """``count`` elements of ``like``'s dtype and device: the start of a kept buffer."""
        key = (backend.name, str(like.dtype), str(getattr(like, "device", "")))
        kept = self._buffers.get(key)
        if kept is None or kept.shape[0] < count:
            kept = self._buffers[key] = backend.empty(count, like)
        return kept[:count]

    def clear(self) -> None:
        """Let go of every buffer."""
        self._buffers.clear()


def scratch_elements(schedule: Schedule, rank: int) -> int:
    """Elements of scratch ``rank`` needs: the most it receives for reduction in one step."""
    sizes = schedule.chunk_sizes
    return max(
        (sum(sizes[t.into] for t in step.recvs if t.reduce) for step in schedule.program(rank)),
        default=0,
    )


@dataclass
class _Run:
    """Consecutive transfers of one pair of ranks in a step that travel as one message."""

    src: int
    dst: int
    src_lo: int
    src_hi: int
    dst_lo: int
    dst_hi: int
    reduce: bool
    src_chunks: list[int]
    dst_chunks: list[int]


def _runs(program: RankProgram, index: int) -> list[_Run]:
    """The messages of the program's rank in step ``index``: its sends, then its receives.

    Within each, in schedule order of their first transfers. Both ends of a message
    derive it alike: transfers of one pair merge when adjacent on both sides, unless
    they reduce at a receiver that also reduces from another rank in the step (the
    order of contributions to a chunk is the schedule's, which a merge could change).
    The receiver sees that in its own receives; the sender is told by ``crowded``.
    """
    bounds = program.chunk_bounds
    step = program.steps[index]
    recvs = step.recvs
    crowded_here = len(recvs) > 1 and len({t.src for t in recvs if t.reduce}) > 1
    last: dict[tuple[int, int], _Run] = {}
    runs: list[_Run] = []
    for transfers, receiving in ((step.sends, False), (recvs, True)):
        for t in transfers:
            chunk, into = t.chunk, t.into
            s_lo, s_hi = bounds[chunk], bounds[chunk + 1]
            if s_lo == s_hi:
                continue
            d_lo, d_hi = bounds[into], bounds[into + 1]
            pair = (t.src, t.dst)
            run = last.get(pair)
            if (
                run is not None
                and run.reduce == t.reduce
                and run.src_hi == s_lo
                and run.dst_hi == d_lo
                and not (t.reduce and (crowded_here if receiving else (index, t.dst) in program.crowded))
            ):
                run.src_hi, run.dst_hi = s_hi, d_hi
                run.src_chunks.append(chunk)
                run.dst_chunks.append(into)
                continue
            run = _Run(t.src, t.dst, s_lo, s_hi, d_lo, d_hi, t.reduce, [chunk], [into])
            last[pair] = run
            runs.append(run)
    return runs


def _segments(length: int, segment: int) -> list[tuple[int, int]]:
    return [(s, min(s + segment, length)) for s in range(0, length, segment)] or [(0, length)]


def _overlap(reduced: list[tuple[int, int]], read: list[tuple[int, int]]) -> bool:
    """Whether a range of ``reduced`` overlaps one of ``read`` (none is empty): a sweep, not every pair.

    Sorted by start, a range overlaps one of the other list seen before it exactly
    when it starts before the furthest end seen there; a step of the direct
    algorithm at 4,096 ranks has 4,095 of each.
    """
    if not reduced or not read:
        return False
    ends = [0, 0]  # the furthest end seen of each list
    for lo, hi, which in sorted([(lo, hi, 0) for lo, hi in reduced] + [(lo, hi, 1) for lo, hi in read]):
        if lo < ends[1 - which]:
            return True
        ends[which] = max(ends[which], hi)
    return False


_Raw = tuple[int, int, int, bool, int, bool]  # a message's peer, lo, hi, fresh, landing, first


def _messages(raw: list[_Raw]) -> tuple[_Message, ...]:
    """The messages of ``raw``, each marked ``lone`` when it is the only one to or from its peer."""
    if len(raw) == 1:  # most steps of most algorithms
        peer, lo, hi, fresh, landing, first = raw[0]
        return (_Message(peer, lo, hi, fresh, landing, lone=True, first=first),)
    peers = Counter(m[0] for m in raw)
    return tuple(
        _Message(peer, lo, hi, fresh, landing, lone=peers[peer] == 1, first=first)
        for peer, lo, hi, fresh, landing, first in raw
    )


@lru_cache(maxsize=512)
def plan(schedule: Schedule, rank: int, segment: int = 0, separate_source: bool = False) -> ProgramPlan:
    """The plan of ``rank``'s part of ``schedule`` (memoized; see :class:`ProgramPlan`).

    For the global view (tests, benchmarks); the call path plans from a rank's
    program, built without the schedule (:func:`program_plan`), to the same plan.

    Args:
        schedule: the schedule.
        rank: the rank.
        segment: elements per segment of a reduced message; 0 for whole messages.
        separate_source: whether the input is read from a source apart from the
            buffer until the schedule first writes each chunk there.
    """
    return _plan(schedule.rank_program(rank), segment, separate_source)


PLANS_KEPT = 512
"""Plans :func:`program_plan` remembers, at most."""

PLANS_BUDGET = 1 << 19
"""The most :attr:`ProgramPlan.size` the plans :func:`program_plan` remembers hold together.

At 4,096 ranks a ring allreduce's plan has some 8,000 steps (size about 33,000), so
a count of plans alone would let the memo grow with the world size; at 8 ranks
the count bounds it first.
"""

_programs_planned: Bounded[tuple[int, int, bool], tuple["weakref.ref[RankProgram]", ProgramPlan]] = Bounded(
    PLANS_KEPT, PLANS_BUDGET, lambda kept: kept[1].size
)


def clear_plans() -> None:
    """Forget the plans :func:`program_plan` remembers, so that the next of each is made afresh."""
    _programs_planned.cache_clear()


def program_plan(program: RankProgram, segment: int = 0, separate_source: bool = False) -> ProgramPlan:
    """The plan of a rank's part from its program, as :func:`plan` makes it of the schedule.

    Memoized by the program's identity (programs are memoized by their shape, see
    :func:`collectives.algorithms.rank_program`), so that a lookup does not hash
    thousands of steps; the memo is bounded by what its plans hold
    (:data:`PLANS_BUDGET`) and does not keep the programs alive.
    """
    key = (id(program), segment, separate_source)
    kept = _programs_planned.get(key)
    if kept is not None and kept[0]() is program:
        return kept[1]
    made = _plan(program, segment, separate_source)
    _programs_planned.put(key, (weakref.ref(program), made))
    return made


def _plan(program: RankProgram, segment: int, separate_source: bool) -> ProgramPlan:
    """The plan of ``program``'s rank (see :class:`ProgramPlan` and :func:`plan`)."""
    bounds = program.chunk_bounds
    written = [not separate_source] * program.num_chunks
    steps: list[_StepPlan] = []
    scratch = 0
    rank = program.rank
    for index in range(len(program.steps)):
        recvs: list[_Raw] = []
        sends: list[_Raw] = []
        prefill: list[tuple[int, int]] = []
        used = 0
        writes: list[int] = []
        reduced: set[int] = set()
        for run in _runs(program, index):
            sender = rank == run.src
            local = run.src_chunks if sender else run.dst_chunks
            if len(local) > 1 and len({written[c] for c in local}) > 1:
                # part fresh, part written: bring the fresh part over first, then use the buffer
                for c in local:
                    if not written[c]:
                        prefill.append((bounds[c], bounds[c + 1]))
                        written[c] = True
            length = run.src_hi - run.src_lo
            pieces = _segments(length, segment) if run.reduce and segment else [(0, length)]
            if sender:
                fresh = not written[local[0]]
                sends += [
                    (run.dst, run.src_lo + p_lo, run.src_lo + p_hi, fresh, -1, False) for p_lo, p_hi in pieces
                ]
                continue
            # a later reduction into the same chunk in this step adds to the first's result
            fresh = run.reduce and not written[local[0]] and local[0] not in reduced
            for p_lo, p_hi in pieces:
                landing = used if run.reduce else -1
                recvs.append((run.src, run.dst_lo + p_lo, run.dst_lo + p_hi, fresh, landing, run.src < rank))
                used += (p_hi - p_lo) if run.reduce else 0
            writes += local
            if run.reduce:
                reduced.update(local)
        if not (recvs or sends):
            continue
        scratch = max(scratch, used)
        reduces = any(m[4] >= 0 for m in recvs)
        overlap = _overlap(
            [(m[1], m[2]) for m in recvs if m[4] >= 0], [(m[1], m[2]) for m in sends if not m[3]]
        )
        steps.append(
            _StepPlan(tuple(prefill), _messages(recvs), _messages(sends), reduces, overlap, first=index == 0)
        )
        for c in writes:
            written[c] = True
    untouched = tuple(
        (bounds[c], bounds[c + 1])
        for c in range(program.num_chunks)
        if not written[c] and bounds[c] < bounds[c + 1]
    )
    return ProgramPlan(tuple(steps), scratch, untouched)


def execute(
    schedule: Schedule | RankProgram,
    transport: Transport,
    backend: ArrayBackend,
    buffer: Any,
    op: ReduceOp | None = None,
    scratch: Any = None,
    *,
    source: Any = None,
    segment_bytes: int = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Run ``transport.rank``'s part of ``schedule`` on ``buffer`` in place.

    Args:
        schedule: the schedule, or the transport's rank's program (built without
            the schedule, see :func:`collectives.algorithms.rank_program`); its
            world size must be the transport's.
        transport: this rank's transport.
        backend: the backend of ``buffer``.
        buffer: this rank's 1-D contiguous buffer of ``schedule.count`` elements.
        op: the reduction, for schedules that reduce.
        scratch: a buffer of at least ``scratch_elements(schedule, rank)``
            elements, or a :class:`Scratch` to take it from; allocated here when omitted.
        source: this rank's input, when it is not already in ``buffer``: read
            where the schedule first sends or reduces each chunk, so that no
            separate copy into ``buffer`` is needed; left unchanged.
        segment_bytes: bytes per segment of a reduced message (see
            :data:`DEFAULT_SEGMENT_BYTES`); every rank must pass the same.
    """
    itemsize = buffer.itemsize if hasattr(buffer, "itemsize") else buffer.element_size()
    segment = max(segment_bytes // itemsize, 1) if segment_bytes > 0 else 0
    if isinstance(schedule, RankProgram):
        if schedule.rank != transport.rank:
            raise ValueError(f"the program of rank {schedule.rank} cannot run on rank {transport.rank}")
        rank_plan = program_plan(schedule, segment, source is not None)
    else:
        rank_plan = plan(schedule, transport.rank, segment, source is not None)
    if op is None and any(s.reduces for s in rank_plan.steps):
        raise ValueError(f"{schedule.name} reduces, so it needs an op")
    if isinstance(scratch, Scratch):
        scratch = scratch.get(backend, rank_plan.scratch, buffer)
    elif scratch is None and rank_plan.scratch:
        scratch = backend.empty(rank_plan.scratch, buffer)
    run(rank_plan, transport, backend, buffer, op, scratch, source)


def opening(rank_plan: ProgramPlan) -> tuple[tuple[_Message, ...], tuple[_Message, ...]]:
    """The sends and receives of the schedule's first step that may travel with a call's signature.

    Each is the only message between its two ranks in its direction in that step,
    which both ends see alike, so a receiver knows which of its peers' signature
    messages carry data. Empty when this rank has no part in the first step.
    """
    if not rank_plan.steps or not rank_plan.steps[0].first:
        return (), ()
    step = rank_plan.steps[0]
    return tuple(m for m in step.sends if m.lone), tuple(m for m in step.recvs if m.lone)


def pack_opening(
    sends: tuple[_Message, ...], backend: ArrayBackend, buffer: Any, source: Any, outgoing: dict[int, Any]
) -> None:
    """Copy the opening ``sends`` (see :func:`opening`) into ``outgoing[peer]``, of ``buffer``'s dtype."""
    src = buffer if source is None else source
    for m in sends:
        backend.copy(outgoing[m.peer], (src if m.fresh else buffer)[m.lo : m.hi])


def run(
    rank_plan: ProgramPlan,
    transport: Transport,
    backend: ArrayBackend,
    buffer: Any,
    op: ReduceOp | None,
    scratch: Any,
    source: Any = None,
    arrived: dict[int, Any] | None = None,
) -> None:
    """Run a plan made by :func:`plan` as :func:`execute` does, for callers that keep the plan.

    Args:
        rank_plan: ``plan(schedule, transport.rank, segment, source is not None)``.
        transport: this rank's transport.
        backend: the backend of ``buffer``.
        buffer: this rank's 1-D contiguous buffer of the schedule's count of elements.
        op: the reduction, when the plan reduces.
        scratch: a buffer of at least ``rank_plan.scratch`` elements (``None`` when that is 0).
        source: this rank's input, when it is not already in ``buffer`` (see :func:`execute`).
        arrived: when the opening messages (see :func:`opening`) travelled with the
            signature: the received ones by peer, arrays of ``buffer``'s dtype; the
            sends among them are not posted again.
    """
    reduce_op: ReduceOp = op  # type: ignore[assignment]  # execute checked it where the plan reduces
    src = buffer if source is None else source
    traced = StepTracer(transport, backend, buffer) if _TRACE.steps else None
    if traced is not None:  # each step, wait, reduction and copy on the trace
        transport, backend = traced.transport, traced.backend
    message = backend.message
    fused = arrived is not None
    for index, step in enumerate(rank_plan.steps):
        if traced is not None:
            traced.step(index, step)
        for lo, hi in step.prefill:
            backend.copy(buffer[lo:hi], src[lo:hi])
        recvs = [
            None
            if fused and m.lone
            else transport.irecv(
                message(
                    buffer[m.lo : m.hi] if m.landing < 0 else scratch[m.landing : m.landing + m.hi - m.lo]
                ),
                m.peer,
                _TAG,
            )
            for m in step.recvs
        ]
        sends = [
            transport.isend(message((src if m.fresh else buffer)[m.lo : m.hi]), m.peer, _TAG)
            for m in step.sends
            if not (fused and m.lone)
        ]
        if fused or step.reduce_after_sends or not step.reduces:
            posted = [r for r in recvs if r is not None] + sends if fused else recvs + sends
            if posted:
                transport.waitall(posted)
            sends = []
            recvs = [None] * len(recvs)
            if not step.reduces and not fused:
                continue
        # reductions in schedule order, each as soon as its segment has arrived
        for m, request in zip(step.recvs, recvs, strict=True):
            if request is not None:
                transport.waitall([request])
            came = arrived[m.peer] if fused and m.lone else None  # type: ignore[index]
            if m.landing >= 0:
                landing = scratch[m.landing : m.landing + m.hi - m.lo] if came is None else came
                if m.first:
                    if m.fresh:
                        backend.reduce_into(reduce_op, buffer[m.lo : m.hi], landing, src[m.lo : m.hi])
                    else:
                        backend.combine_after(reduce_op, buffer[m.lo : m.hi], landing)
                elif m.fresh:
                    backend.reduce_into(reduce_op, buffer[m.lo : m.hi], src[m.lo : m.hi], landing)
                else:
                    backend.combine(reduce_op, buffer[m.lo : m.hi], landing)
            elif came is not None:
                backend.copy(buffer[m.lo : m.hi], came)
        if sends:
            transport.waitall(sends)
        fused = False
    if traced is not None:
        traced.end()
    if source is not None:
        for lo, hi in rank_plan.untouched:
            backend.copy(buffer[lo:hi], source[lo:hi])
