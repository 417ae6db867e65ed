"""An algorithm's time on a topology at any world size: from its schedule while small, else from programs.

The link model (:func:`collectives.topology.link_model.predict`) routes every
transfer of a global schedule, which at thousands of ranks holds tens of
millions of them. :func:`predict_algorithm` builds the global schedule only
while it is small (:data:`GLOBAL_TRANSFERS`, estimated from rank 0's program)
and otherwise sums the link loads of the ranks' own programs
(:func:`collectives.topology.programs.predict_programs`): every machine's
while they are few enough, a sample of machines past that. Trees and the
butterfly stay exact at 4,096 ranks (their schedules are small); the ring,
halving-doubling, multi-ring, hierarchical, direct and shared-memory schedules
are predicted from the first, middle and last machines' ranks, which on machines of
equal size is the exact figure (the tests compare both, forcing the sample,
at up to 64 ranks).
"""

__all__ = ["GLOBAL_TRANSFERS", "PROGRAM_ENTRIES", "predict_algorithm", "predicts_by_sample", "traffic_on"]

from collections.abc import Callable

from . import algorithms
from .algorithms.base import builder, topology_builder, topology_program_builder
from .chunking import even_split
from .errors import TopologyError, UnknownAlgorithmError
from .schedule import RankProgram, Schedule
from .specs import get_spec
from .topology import Topology
from .topology.cost_model import Traffic, traffic
from .topology.link_model import Prediction, predict_fast
from .topology.programs import ALL_RANKS_BUDGET, predict_programs, program_traffic

GLOBAL_TRANSFERS = 500_000
"""The most transfers built as a schedule (estimated: rank 0's sends and receives times the ranks, halved).

Building and routing half a million transfers takes about a second; past it,
the ranks' programs are summed instead.
"""


PROGRAM_ENTRIES = 4_000_000
"""The most sends and receives rank 0's program may hold to be predicted (about 5 s and 1 GB to build)."""


def predict_algorithm(
    collective: str,
    algorithm: str,
    count: int,
    itemsize: int,
    topology: Topology,
    *,
    root: int = 0,
    fitted: bool = True,
    budget: int = ALL_RANKS_BUDGET,
) -> Prediction:
    """Predict a registered algorithm's ``collective`` of ``count`` elements on ``topology``, rank r on GPU r.

    Args:
        collective: the collective's name.
        algorithm: a registered algorithm that implements it.
        count: as for :func:`collectives.algorithms.build_schedule` (alltoall's, a
            multiple of the world size).
        itemsize: bytes per element.
        topology: the machine; one rank per GPU.
        root: the root of a rooted collective.
        fitted: run the schedule the algorithm fits to the machine, where it has
            one (``for_topology``: multi_ring on packed rings, hierarchical by the
            machine's nodes), as the selector does.
        budget: passed to :func:`~collectives.topology.programs.predict_programs`;
            0 samples machines wherever the topology allows (the tests use it).

    Raises:
        TopologyError: the topology cannot carry the schedule.
        ValueError: rank 0's program would pass :data:`PROGRAM_ENTRIES`; and as for ``build_schedule``.
        UnknownAlgorithmError: as for ``build_schedule``.
    """
    size = len(topology.gpus)
    module = algorithms.ALGORITHMS.get(algorithm)
    fitted_program = _fitted_program(collective, algorithm, count, topology) if fitted else None
    if fitted_program is not None:
        return predict_programs(fitted_program, size, topology, itemsize, budget=budget)
    fit = None if not fitted or module is None else topology_builder(module)
    schedule = None if fit is None else fit(collective, size, count, topology)
    if schedule is not None:
        return predict_fast(schedule, topology, itemsize)

    def default_program(rank: int) -> RankProgram:
        return algorithms.rank_program(collective, algorithm, size, count, root=root, rank=rank)

    expected = _rank_zero_entries(collective, algorithm, size, count, root)
    if expected > PROGRAM_ENTRIES:
        raise ValueError(
            f"{algorithm}'s {collective} gives rank 0 about {expected:,} transfers at {size} ranks "
            f"(more than {PROGRAM_ENTRIES:,}): not predicted"
        )
    if budget > 0 and _transfers(default_program(0), size) <= GLOBAL_TRANSFERS:
        return predict_fast(_build(collective, algorithm, size, count, root), topology, itemsize)
    return predict_programs(default_program, size, topology, itemsize, budget=budget)


def _rank_zero_entries(collective: str, algorithm: str, world_size: int, count: int, root: int) -> int:
    """Rank 0's sends and receives at ``world_size``, foreseen from its programs at a quarter and an eighth.

    An algorithm that gives one rank work growing as P squared (direct's
    reduce-scatter: 16 M transfers at 4,096 ranks) would take minutes and
    gigabytes to build; below 1,024 ranks it is built and counted.
    """
    if world_size < 1024:
        return 0

    def entries(size: int) -> int:
        program = algorithms.rank_program(collective, algorithm, size, count, root=root, rank=0)
        return sum(len(step.sends) + len(step.recvs) for step in program.steps)

    eighth, quarter = entries(world_size // 8), entries(world_size // 4)
    growth = max(quarter / max(eighth, 1), 1.0)
    return int(quarter * growth * growth)


def _transfers(first: RankProgram, world_size: int) -> int:
    """The global schedule's transfers, estimated from rank 0's: each is a send and a receive."""
    return sum(len(step.sends) + len(step.recvs) for step in first.steps) * world_size // 2


def traffic_on(collective: str, algorithm: str, count: int, topology: Topology) -> tuple[str, Traffic]:
    """The name and counted traffic of what :func:`predict_algorithm` (fitted) predicts, unbuilt.

    By the algorithm's formula (:func:`collectives.algorithms.schedule_traffic`),
    or, for a schedule fitted to the machine that has rank programs, from the
    programs of the ranks :func:`predict_algorithm` follows.
    """
    size = len(topology.gpus)
    fitted_program = _fitted_program(collective, algorithm, count, topology)
    if fitted_program is not None:
        return fitted_program(0).name, program_traffic(fitted_program, size, topology)
    module = algorithms.ALGORITHMS.get(algorithm)
    fit = None if module is None else topology_builder(module)
    schedule = None if fit is None else fit(collective, size, count, topology)
    if schedule is not None:
        return schedule.name, traffic(schedule)
    return algorithms.schedule_traffic(collective, algorithm, size, count)


def _fitted_program(
    collective: str, algorithm: str, count: int, topology: Topology
) -> Callable[[int], RankProgram] | None:
    """Rank r's part of the schedule fitted to ``topology``; ``None`` where there are no such programs."""
    module = algorithms.ALGORITHMS.get(algorithm)
    build = None if module is None else topology_program_builder(module)
    size = len(topology.gpus)
    if build is None or build(collective, size, count, topology, 0) is None:
        return None
    fit = build

    def program(rank: int) -> RankProgram:
        found = fit(collective, size, count, topology, rank)
        if found is None:
            raise TopologyError(f"{algorithm} fits rank 0 to {topology.name} but not rank {rank}")
        return found

    return program


def predicts_by_sample(collective: str, algorithm: str, count: int, topology: Topology) -> bool:
    """Whether :func:`predict_algorithm` (unfitted) starts from a sample of machines; builds rank 0's program.

    It follows every machine after all where the sample's machines are not alike.
    """
    size = len(topology.gpus)
    first = algorithms.rank_program(collective, algorithm, size, count, rank=0)
    transfers = _transfers(first, size)
    return transfers > GLOBAL_TRANSFERS and 2 * transfers > ALL_RANKS_BUDGET and len(topology.nodes) > 2


def _build(collective: str, algorithm: str, world_size: int, count: int, root: int) -> Schedule:
    """The global schedule, built uncached (the registry's cache would keep the large ones)."""
    build = builder(algorithms.ALGORITHMS[algorithm], collective)
    if build is None:
        raise UnknownAlgorithmError(f"{algorithm} has no {collective}")
    spec = get_spec(collective)
    args: tuple[object, ...] = (world_size, count) if spec.carries_data else (world_size,)
    if spec.shared:
        args = (tuple(even_split(count, world_size)),)
    return build(*args, root) if spec.rooted else build(*args)
