"""Runs a schedule for every rank in one process: checks it against its spec and counts its traffic."""

__all__ = ["SimulationResult", "simulate"]

from dataclasses import dataclass

from .errors import ScheduleError
from .schedule import Schedule
from .specs import CollectiveSpec, Contribution, Token, describe, get_spec


@dataclass(frozen=True)
class SimulationResult:
    """What a schedule does, counted per rank.

    Attributes:
        name: the schedule's name.
        steps: rounds of transfers.
        messages_sent: messages each rank sends, empty chunks included.
        elements_sent: elements each rank sends.
        elements_received: elements each rank receives.
    """

    name: str
    steps: int
    messages_sent: tuple[int, ...]
    elements_sent: tuple[int, ...]
    elements_received: tuple[int, ...]

    def bytes_sent(self, itemsize: int) -> tuple[int, ...]:
        """Bytes each rank sends for elements of ``itemsize`` bytes."""
        return tuple(n * itemsize for n in self.elements_sent)


def simulate(schedule: Schedule) -> SimulationResult:
    """Run ``schedule`` symbolically and check it meets its collective's contract.

    Each rank's chunks are tracked as the set of ranks whose inputs they
    combine, so the check is exact and independent of floating point.

    Raises:
        ScheduleError: at the first transfer or final (rank, chunk) that is wrong,
            naming the step, rank, chunk, and what was expected.
    """
    spec = get_spec(schedule.collective)
    state = spec.before(schedule)
    size = schedule.world_size
    messages = [0] * size
    sent = [0] * size
    received = [0] * size
    for index, step in enumerate(schedule.steps):
        # sends read the state as the step began
        start: list[list[Contribution]] = [list(chunks) for chunks in state]
        for t in step.transfers:
            incoming = start[t.src][t.chunk]
            if incoming is None:
                raise ScheduleError(
                    f"{schedule.name}: step {index}: rank {t.src} sends chunk {t.chunk} "
                    "before it holds any data",
                    step=index, rank=t.src, chunk=t.chunk,
                )  # fmt: skip
            if t.reduce:
                _reduce_into(schedule, spec, state, index, t.dst, t.into, incoming)
            else:
                state[t.dst][t.into] = incoming
            elements = schedule.chunk_sizes[t.chunk]
            messages[t.src] += 1
            sent[t.src] += elements
            received[t.dst] += elements
    spec.check_after(schedule, state)
    return SimulationResult(schedule.name, len(schedule.steps), tuple(messages), tuple(sent), tuple(received))


def _reduce_into(
    schedule: Schedule,
    spec: CollectiveSpec,
    state: list[list[Contribution]],
    step: int,
    rank: int,
    chunk: int,
    incoming: frozenset[Token],
) -> None:
    where = dict(step=step, rank=rank, chunk=chunk)
    if not spec.reduces:
        raise ScheduleError(
            f"{schedule.name}: step {step}: {schedule.collective} does not reduce, "
            f"yet rank {rank} reduces into chunk {chunk}",
            **where,
        )
    current = state[rank][chunk]
    if current is None:
        raise ScheduleError(
            f"{schedule.name}: step {step}: rank {rank} reduces into chunk {chunk}, which holds no data",
            **where,
        )
    twice = current & incoming
    if twice and not spec.idempotent:
        raise ScheduleError(
            f"{schedule.name}: step {step}: rank {rank} reduces chunk {chunk} twice: "
            f"{describe(twice, chunk)} would be counted twice",
            expected=current,
            actual=incoming,
            **where,
        )
    state[rank][chunk] = current | incoming
