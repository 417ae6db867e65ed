"""What an algorithm module provides, and the one place its optional hooks are looked up.

An algorithm is a module of pure functions, one family per file
(``collectives/algorithms/<name>.py``), registered by name in
:data:`collectives.algorithms.ALGORITHMS`. To add one:

1. Write a **builder** for each collective it implements, named after the
   collective (:data:`collectives.specs.COLLECTIVES`) and returning a
   :class:`~collectives.schedule.Schedule`. Its arguments follow the collective's
   spec (:func:`collectives.algorithms.build_schedule` calls it so):

   * ``allreduce(world_size, count)``, ``alltoall(world_size, count)``;
   * ``reduce_scatter(shares)``, ``allgather(shares)``: where each rank owns a
     share of the buffer, the elements of each rank's share;
   * ``broadcast(world_size, count, root)``, ``reduce(world_size, count, root)``,
     ``gather(shares, root)``, ``scatter(shares, root)``: rooted collectives take
     the root last;
   * ``barrier(world_size)``: it moves no data.

   Further parameters (rings, chunks, ...) must have defaults. ``Schedule.named``
   (``share_schedule`` where each rank owns a share) builds it under the name
   ``<collective>-<algorithm>(n=<ranks>)``, and ``RankProgram.named`` a rank's part.
2. Write ``cost(collective, shares)`` (with ``root=`` where it implements a rooted
   collective) giving its documented :class:`Cost`; the tests check it against
   the simulator's counts.
3. Optionally, the hooks of :class:`Algorithm`'s docstring: ``REQUIRES`` and
   ``REQUIRES_TEXT``, ``not_supported_reasons``, ``for_topology``, ``traffic``,
   and the two that let thousands of ranks go without the global schedule:
   ``rank_program`` (one rank's part, built from its rank number) and
   ``schedule_traffic`` (the selector's counts, by formula). Without them a
   rank's part is projected from the global schedule and the counts are taken
   from it, which costs time and memory growing with P times the steps.
4. Register it in :data:`~collectives.algorithms.ALGORITHMS` and run
   ``python -m bench algorithms --update docs/algorithms.md``.

Nothing outside this module reads an algorithm's attributes by name: the
registry, the selector and the executor ask through the helpers here
(:func:`builder`, :func:`implements`, :func:`required_feature`, ...), so every
hook an algorithm may define is written down once, below.
"""

__all__ = [
    "Algorithm",
    "Builder",
    "Cost",
    "NotSupportedReasons",
    "RankProgramBuilder",
    "TopologyBuilder",
    "TopologyProgramBuilder",
    "TrafficCounter",
    "TrafficFormula",
    "builder",
    "implements",
    "rank_program_builder",
    "required_feature",
    "requirements_text",
    "requires",
    "topology_builder",
    "topology_program_builder",
    "traffic_counter",
    "traffic_formula",
    "unsupported_reasons",
]

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NamedTuple, Protocol

from ..schedule import RankProgram, Schedule

if TYPE_CHECKING:
    from ..topology import Topology, Traffic


class Cost(NamedTuple):
    """An algorithm's documented traffic: rounds of transfers and elements each rank sends.

    Every algorithm module gives it from ``cost(collective, shares)``, with a
    ``root=`` keyword where it implements a rooted collective, and the tests
    check it against the simulator's counts.
    """

    steps: int
    elements_sent: tuple[int, ...]


class Algorithm(Protocol):
    """An algorithm module, as the registry holds it.

    Required, besides ``cost`` below: a builder for at least one collective,
    named after it (see the module docstring for each collective's arguments).

    Optional hooks, module attributes found through this module's helpers:

    ``REQUIRES: str``
        The transport feature the algorithm needs to run, and so to be chosen
        (``"shared_memory"``: ranks on one node; ``"shared_memory_nodes"``: nodes
        sharing memory within each). Without it, every transport runs it.
        See :func:`required_feature`, :func:`requires`.
    ``REQUIRES_TEXT: str``
        That need in words, for the selector's reasons and the docs
        (:func:`requirements_text`).
    ``not_supported_reasons(collective, world_size, count, features) -> list[str]``
        Why it cannot run a case it has a builder for, given the transport's
        ``features``; empty where it can (:class:`NotSupportedReasons`,
        :func:`unsupported_reasons`).
    ``for_topology(collective, world_size, count, topology) -> Schedule | None``
        The schedule that fits a machine (e.g. rings packed on its links), or
        ``None`` to be built as for MPI, rank r on GPU r (:class:`TopologyBuilder`,
        :func:`topology_builder`).
    ``traffic(collective, world_size, count, features) -> tuple[int, ...]``
        ``(steps, messages, elements, reduced, barriers, copied)``: the
        critical-path traffic of an algorithm run its own way (not message by
        message, e.g. through shared memory), in the fields of
        :class:`collectives.topology.cost_model.Traffic`; without it the cost
        model counts the schedule's transfers (:class:`TrafficCounter`,
        :func:`traffic_counter`).
    ``rank_program(collective, shares, root, rank) -> RankProgram | None``
        Rank ``rank``'s part of the schedule the builder makes of ``shares``
        (each rank's share of the buffer; an even split of the count for the
        collectives without shares) and ``root`` (``None`` for the unrooted),
        computed from the rank number in time and memory proportional to that
        rank's transfers, equal to the projection of the global schedule;
        ``None`` for a case it does not cover, which is then projected
        (:class:`RankProgramBuilder`, :func:`rank_program_builder`).
    ``for_topology_program(collective, world_size, count, topology, rank) -> RankProgram | None``
        Rank ``rank``'s part of ``for_topology``'s schedule, from its rank number,
        so a prediction on a machine of thousands of GPUs need not build it;
        ``None`` where ``for_topology`` gives none (:class:`TopologyProgramBuilder`,
        :func:`topology_program_builder`).
    ``schedule_traffic(collective, world_size, count) -> tuple[str, Traffic] | None``
        The name and :func:`collectives.topology.cost_model.traffic` of the
        schedule the builder makes of ``count`` elements evenly shared, by
        formula, without building it; ``None`` for a case it does not cover,
        which is then built and counted (:class:`TrafficFormula`,
        :func:`traffic_formula`). The tests check both against the schedule.
    """

    def cost(self, collective: str, shares: Sequence[int]) -> Cost:
        """The documented steps and elements each rank sends for ``collective`` of ``shares``."""
        ...


Builder = Callable[..., Schedule]
"""A builder: the schedule of one collective, from the arguments its spec gives (module docstring)."""


class NotSupportedReasons(Protocol):
    """The optional ``not_supported_reasons`` hook."""

    def __call__(self, collective: str, world_size: int, count: int, features: frozenset[str]) -> list[str]:
        """Why the algorithm cannot run this case over a transport offering ``features``; empty if it can."""
        ...


class TopologyBuilder(Protocol):
    """The optional ``for_topology`` hook."""

    def __call__(self, collective: str, world_size: int, count: int, topology: "Topology") -> Schedule | None:
        """The schedule fitted to ``topology``, one GPU per rank; ``None`` to build it as for MPI."""
        ...


class TopologyProgramBuilder(Protocol):
    """The optional ``for_topology_program`` hook."""

    def __call__(
        self, collective: str, world_size: int, count: int, topology: "Topology", rank: int
    ) -> RankProgram | None:
        """Rank ``rank``'s part of the schedule fitted to ``topology``; ``None`` where none is fitted."""
        ...


class TrafficCounter(Protocol):
    """The optional ``traffic`` hook."""

    def __call__(
        self, collective: str, world_size: int, count: int, features: frozenset[str]
    ) -> tuple[int, int, int, int, int, int]:
        """``(steps, messages, elements, reduced, barriers, copied)`` of the algorithm's own execution."""
        ...


class RankProgramBuilder(Protocol):
    """The optional ``rank_program`` hook."""

    def __call__(
        self, collective: str, shares: tuple[int, ...], root: int | None, rank: int
    ) -> RankProgram | None:
        """Rank ``rank``'s part of the schedule, from its rank number; ``None`` where not covered."""
        ...


class TrafficFormula(Protocol):
    """The optional ``schedule_traffic`` hook."""

    def __call__(self, collective: str, world_size: int, count: int) -> "tuple[str, Traffic] | None":
        """The schedule's name and counted traffic, by formula; ``None`` where not covered."""
        ...


def builder(algorithm: object, collective: str) -> Builder | None:
    """The algorithm's builder for ``collective``; ``None`` where it does not implement it."""
    found: Builder | None = getattr(algorithm, collective, None)
    return found


def implements(algorithm: object, collective: str) -> bool:
    """Whether the algorithm has a builder for ``collective``."""
    return builder(algorithm, collective) is not None


def required_feature(algorithm: object) -> str | None:
    """The transport feature the algorithm needs (its ``REQUIRES``); ``None`` for none.

    Where ``needs = getattr(ALGORITHMS[name], "REQUIRES", None)`` was written, write
    ``needs = required_feature(ALGORITHMS[name])``.
    """
    needs = getattr(algorithm, "REQUIRES", None)
    return None if needs is None else str(needs)


def requires(algorithm: object, feature: str) -> bool:
    """Whether the algorithm needs the transport feature ``feature`` (e.g. ``"shared_memory"``)."""
    return required_feature(algorithm) == feature


def requirements_text(algorithm: object) -> str | None:
    """The algorithm's need in words (its ``REQUIRES_TEXT``); ``None`` where it gives none."""
    text = getattr(algorithm, "REQUIRES_TEXT", None)
    return None if text is None else str(text)


def unsupported_reasons(
    algorithm: object, collective: str, world_size: int, count: int, features: frozenset[str]
) -> list[str]:
    """The algorithm's own reasons not to run this case (its ``not_supported_reasons``); empty for none."""
    ask: NotSupportedReasons | None = getattr(algorithm, "not_supported_reasons", None)
    return [] if ask is None else list(ask(collective, world_size, count, features))


def topology_builder(algorithm: object) -> TopologyBuilder | None:
    """The algorithm's ``for_topology``; ``None`` where it builds the same schedule on every machine."""
    found: TopologyBuilder | None = getattr(algorithm, "for_topology", None)
    return found


def topology_program_builder(algorithm: object) -> TopologyProgramBuilder | None:
    """The algorithm's ``for_topology_program``; ``None`` where a fitted schedule is built to be predicted."""
    found: TopologyProgramBuilder | None = getattr(algorithm, "for_topology_program", None)
    return found


def traffic_counter(algorithm: object) -> TrafficCounter | None:
    """The algorithm's ``traffic``; ``None`` where the cost model counts the schedule's transfers."""
    found: TrafficCounter | None = getattr(algorithm, "traffic", None)
    return found


def rank_program_builder(algorithm: object) -> RankProgramBuilder | None:
    """The algorithm's ``rank_program``; ``None`` where a rank's part is projected from the schedule."""
    found: RankProgramBuilder | None = getattr(algorithm, "rank_program", None)
    return found


def traffic_formula(algorithm: object) -> TrafficFormula | None:
    """The algorithm's ``schedule_traffic``; ``None`` where the selector builds and counts the schedule."""
    found: TrafficFormula | None = getattr(algorithm, "schedule_traffic", None)
    return found
