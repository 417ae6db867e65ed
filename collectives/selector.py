"""Choosing an algorithm for ``algorithm="auto"``: the one the cost model predicts fastest, with reasons."""

__all__ = [
    "AUTO",
    "Selector",
    "check_algorithm",
    "clear_traffic_counts",
    "default_selector",
    "layout_features",
    "nodes_of",
    "rejection_reasons",
    "selector_for",
]
# Also importable from here, where api.py, users and the docs import them (``import X as X``):
# the cost model's names from collectives.topology.cost_model, the calibration file's from
# collectives.calibration, the explanation's from collectives.explanation, itemsize from ops.

import numbers
from dataclasses import replace
from functools import lru_cache

from . import algorithms, prediction
from .algorithms.base import (
    implements,
    required_feature,
    requirements_text,
    traffic_counter,
    unsupported_reasons,
)
from .calibration import CALIBRATION_ENV as CALIBRATION_ENV
from .calibration import calibration_path as calibration_path
from .calibration import load_model as load_model
from .calibration import save_model as save_model
from .errors import CollectivesError, TopologyError, UnknownAlgorithmError
from .explanation import Candidate as Candidate
from .explanation import Explanation as Explanation
from .explanation import Rejected as Rejected
from .ops import ReduceOp, get_op
from .ops import itemsize as itemsize
from .specs import get_spec
from .topology import Prediction, Topology
from .topology.cost_model import DEFAULT_MODEL as DEFAULT_MODEL
from .topology.cost_model import NETWORK_ALPHA as NETWORK_ALPHA
from .topology.cost_model import CostModel as CostModel
from .topology.cost_model import Traffic as Traffic
from .topology.cost_model import traffic as traffic

_SPLIT_UP_TO = 64  # world sizes whose schedules are built to tell steps within a node from those between

AUTO = "auto"
"""The algorithm name that asks the selector to choose."""

_CHOICES_KEPT = 4096  # distinct (collective, world size, count, itemsize) choices remembered per selector


@lru_cache(maxsize=256)
def _on_topology(
    collective: str, algorithm: str, world_size: int, count: int, itemsize: int, topology: Topology
) -> tuple[str, Traffic, Prediction]:
    """A registered algorithm's schedule as run on ``topology``, its traffic and its predicted time.

    A module with ``for_topology(collective, world_size, count, topology)`` runs
    what fits the machine (e.g. multi_ring on its packed rings, hierarchical by
    its nodes); any other runs as for MPI, rank r on GPU r. Neither is built
    where it is large: the counts come by formula or from rank programs, the
    time from the ranks' programs (:mod:`collectives.prediction`).
    """
    name, counted = prediction.traffic_on(collective, algorithm, count, topology)
    return name, counted, prediction.predict_algorithm(collective, algorithm, count, itemsize, topology)


@lru_cache(maxsize=1024)
def _counted(
    collective: str, algorithm: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> tuple[str, Traffic]:
    """The name and traffic of a registered algorithm's schedule, evenly shared (memoized).

    By the algorithm's formula where it has one (:func:`collectives.algorithms.schedule_traffic`),
    so choosing among thousands of ranks builds no schedule. A module that runs its
    schedule its own way (``shared_memory``) gives the traffic of that execution
    from ``traffic(collective, world_size, count, features)``.
    """
    name, counted = algorithms.schedule_traffic(collective, algorithm, world_size, count)
    own = traffic_counter(algorithms.ALGORITHMS[algorithm])
    if own is None:
        return name, counted
    counted = Traffic(*own(collective, world_size, count, features))
    # such an algorithm sends at most one message a step (the hierarchy's ring between nodes); its
    # other steps go through shared memory, priced by their barriers and copies, not as steps of messages
    return name, replace(counted, shared_steps=counted.steps - counted.messages)


@lru_cache(maxsize=1024)
def _counted_on_nodes(
    collective: str, algorithm: str, world_size: int, count: int, features: frozenset[str], per_node: int
) -> tuple[str, Traffic]:
    """As :func:`_counted`, over nodes of ``per_node`` ranks: which messages and bytes cross the network.

    An algorithm that runs its own way (``hierarchical_shared_memory``) moves data
    within a node through shared memory, so all its messages are between nodes. A
    schedule is counted step by step on the ranks' nodes (rank r on node r //
    ``per_node``, as the transport splits them); past :data:`_SPLIT_UP_TO` ranks every
    step is taken to cross (the schedule is not built there), which overstates
    the hierarchical schedules only.
    """
    name, counted = _counted(collective, algorithm, world_size, count, features)
    if traffic_counter(algorithms.ALGORITHMS[algorithm]) is None and world_size <= _SPLIT_UP_TO:
        schedule = algorithms.build_schedule(collective, algorithm, world_size, count)
        split = traffic(schedule, per_node)
        return name, replace(
            counted, network_messages=split.network_messages, network_elements=split.network_elements
        )
    return name, replace(counted, network_messages=counted.messages, network_elements=counted.elements)


def clear_traffic_counts() -> None:
    """Forget the memoized traffic counts, so that the next choice or ``explain`` counts afresh."""
    _counted.cache_clear()
    _counted_on_nodes.cache_clear()


def nodes_of(world_size: int, features: frozenset[str]) -> tuple[int, int] | None:
    """``(nodes, ranks per node)`` where ``features`` say the ranks span several nodes, else ``None``."""
    if "shared_memory_nodes" not in features:
        return None
    per_node = algorithms.hierarchical_shared_memory.ranks_per_node(features) or world_size
    return max(world_size // per_node, 1), per_node


def layout_features(world_size: int, ranks_per_node: int) -> frozenset[str]:
    """The features a communicator finds where ``world_size`` ranks run ``ranks_per_node`` to a node.

    As the MPI transport splits the ranks: all on one node share its memory; nodes of
    equal size, more than one rank each, share memory within each node; otherwise
    (one rank a node, or nodes of unequal size) the ranks share none.

    Raises:
        ValueError: ``ranks_per_node`` is not a whole number of at least 1.
    """
    whole = isinstance(ranks_per_node, numbers.Integral) and not isinstance(ranks_per_node, bool)
    if not whole or ranks_per_node < 1:
        raise ValueError(f"ranks_per_node is a whole number of at least 1; got {ranks_per_node!r}")
    if ranks_per_node >= world_size:
        return frozenset({"shared_memory"})
    if ranks_per_node > 1 and world_size % ranks_per_node == 0:
        return frozenset({"shared_memory_nodes", f"ranks_per_node={ranks_per_node}"})
    return frozenset()


def check_algorithm(collective: str, algorithm: str) -> None:
    """Raise unless ``algorithm`` is ``"auto"`` or a registered algorithm that implements ``collective``.

    Raises:
        UnknownAlgorithmError: listing the valid names, ``"auto"`` first.
    """
    if algorithm == AUTO or implements(algorithms.ALGORITHMS.get(algorithm), collective):
        return
    get_spec(collective)
    valid = [name for name, module in algorithms.ALGORITHMS.items() if implements(module, collective)]
    raise UnknownAlgorithmError(
        f"unknown algorithm {algorithm!r} for {collective}; valid algorithms are {', '.join([AUTO, *valid])}"
    )


def rejection_reasons(
    collective: str, algorithm: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> list[str]:
    """Why a registered algorithm cannot run ``collective`` of ``count`` elements over ``world_size`` ranks.

    A module without a builder for the collective cannot, nor one whose
    ``REQUIRES`` names a transport feature not in ``features`` (e.g.
    ``"shared_memory"``); one that defines ``not_supported_reasons(collective,
    world_size, count, features)`` is asked. Empty if the algorithm applies.
    """
    module = algorithms.ALGORITHMS[algorithm]
    if not implements(module, collective):
        return [f"{algorithm} has no {collective}"]
    needs = required_feature(module)
    if needs is not None and needs not in features:
        text = requirements_text(module)
        text = "ranks on one node" if text is None else text
        return [f"needs a transport with {needs.replace('_', ' ')} ({text})"]
    return unsupported_reasons(module, collective, world_size, count, features)


class Selector:
    """Chooses the algorithm the cost model predicts fastest, and explains the choice.

    Every algorithm in :data:`collectives.algorithms.ALGORITHMS` is a candidate
    unless it reports reasons not to be. Choices are remembered per (collective,
    world size, count, itemsize), so a repeated choice is one dict lookup; call
    :meth:`clear` after changing the registry.
    """

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self._choices: dict[tuple[str, int, int, int, frozenset[str]], str] = {}

    def choose(
        self,
        collective: str,
        world_size: int,
        count: int,
        itemsize: int,
        features: frozenset[str] = frozenset(),
    ) -> str:
        """The fastest algorithm for ``collective`` of ``count`` elements of ``itemsize`` bytes.

        ``features`` are what the transport offers (e.g. ``"shared_memory"``).

        Raises:
            UnknownAlgorithmError: no registered algorithm applies; the message gives the reasons.
        """
        key = (collective, world_size, count, itemsize, features)
        choice = self._choices.get(key)
        if choice is None:
            candidates, rejected = self._rank(collective, world_size, count, itemsize, features)
            if not candidates:
                reasons = "; ".join(f"{r.algorithm}: {', '.join(r.reasons)}" for r in rejected)
                raise UnknownAlgorithmError(
                    f"no algorithm runs {collective} of {count} elements over {world_size} ranks ({reasons})"
                )
            choice = candidates[0].algorithm
            if len(self._choices) >= _CHOICES_KEPT:
                # start afresh rather than evict one by one: cheap, and safe for loopback threads
                self._choices.clear()
            self._choices[key] = choice
        return choice

    def ranked(
        self,
        collective: str,
        world_size: int,
        count: int,
        itemsize: int,
        features: frozenset[str] = frozenset(),
    ) -> tuple[Candidate, ...]:
        """The candidates for a call, fastest predicted first (what :meth:`choose` takes the first of)."""
        return self._rank(collective, world_size, count, itemsize, features)[0]

    def explain(
        self,
        collective: str,
        count: int,
        dtype: object = "float32",
        *,
        world_size: int,
        op: "str | ReduceOp" = "sum",
        features: frozenset[str] = frozenset(),
        topology: Topology | None = None,
    ) -> Explanation:
        """Every algorithm's prediction for ``collective`` of ``count`` elements, and the choice.

        Args:
            collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
            count: elements of the full buffer.
            dtype: the element type, by name or as a dtype.
            world_size: the number of ranks.
            op: the reduction, checked against the dtype; ignored by collectives that do not reduce.
            features: what the transport offers, as for :meth:`choose`.
            topology: a machine with one GPU per rank: transfers are then predicted on its
                links (:func:`collectives.prediction.predict_algorithm`: the link model, from
                the ranks' programs where the schedule is large) and algorithms that know how
                run what fits it (multi_ring on its packed rings, hierarchical by its nodes).
        """
        name = str(getattr(dtype, "name", dtype))
        size = itemsize(name)
        reduce_op: str | None = None
        if get_spec(collective).reduces:
            get_op(op).check_dtype(name)
            reduce_op = get_op(op).name
        if not isinstance(count, numbers.Integral) or isinstance(count, bool):
            raise TypeError(f"count is the number of elements, an int; got {type(count).__name__}")
        if world_size < 1 or count < 0:
            raise ValueError(f"need world_size >= 1 and count >= 0; got {world_size} and {count}")
        if topology is not None and len(topology.gpus) != world_size:
            raise ValueError(
                f"topology {topology.name} has {len(topology.gpus)} GPUs, not one per rank of {world_size}"
            )
        candidates, rejected = self._rank(collective, world_size, count, size, features, topology)
        choice = candidates[0].algorithm if candidates else None
        return Explanation(
            collective,
            count,
            name,
            world_size,
            reduce_op,
            self.model,
            candidates,
            rejected,
            choice,
            topology,
            nodes=nodes_of(world_size, features),
        )

    def clear(self) -> None:
        """Forget remembered choices."""
        self._choices.clear()

    def _rank(
        self,
        collective: str,
        world_size: int,
        count: int,
        itemsize: int,
        features: frozenset[str],
        topology: Topology | None = None,
    ) -> tuple[tuple[Candidate, ...], tuple[Rejected, ...]]:
        """The candidates, fastest first (ties in registry order), and the rejected algorithms."""
        get_spec(collective)
        candidates: list[Candidate] = []
        rejected: list[Rejected] = []
        # across nodes a step of messages waits for those between nodes, and a barrier is a node's
        split = nodes_of(world_size, features)
        per_node = None if split is None else split[1]
        for name in algorithms.ALGORITHMS:
            reasons = rejection_reasons(collective, name, world_size, count, features)
            on_links = None
            if not reasons:
                try:
                    if topology is None and per_node is not None:
                        schedule, counted = _counted_on_nodes(
                            collective, name, world_size, count, features, per_node
                        )
                    elif topology is None:
                        schedule, counted = _counted(collective, name, world_size, count, features)
                    else:
                        schedule, counted, on_links = _on_topology(
                            collective, name, world_size, count, itemsize, topology
                        )
                except TopologyError as error:
                    reasons = [f"no route on {topology.name if topology else 'the topology'}: {error}"]
                except (CollectivesError, ValueError) as error:
                    # an algorithm that cannot build this case without saying so is still no candidate
                    reasons = [f"cannot be built: {error}"]
            if reasons:
                rejected.append(Rejected(name, tuple(reasons)))
                continue
            latency, transfer, reduction = self.model.terms(
                counted, itemsize, world_size, ranks_per_node=per_node
            )
            factor = 1.0
            if on_links is not None:
                latency, transfer = on_links.latency_s, on_links.bandwidth_s
            elif self.model.corrections:  # what the calibration measured of it, beyond the constants
                factor = self.model.correction(name, count * itemsize)
                latency, transfer, reduction = latency * factor, transfer * factor, reduction * factor
            candidates.append(
                Candidate(name, schedule, counted, itemsize, latency, transfer, reduction, factor)
            )
        # sorted() is stable, so equal predictions keep the registry's order
        return tuple(sorted(candidates, key=lambda c: c.time)), tuple(rejected)


@lru_cache(maxsize=16)
def selector_for(model: CostModel) -> Selector:
    """The one selector of a cost model, so its remembered choices are shared."""
    return Selector(model)


@lru_cache(maxsize=64)
def default_selector(world_size: int, nodes: int = 1) -> Selector:
    """The selector of the calibration for ``world_size`` ranks on ``nodes`` nodes (:func:`load_model`).

    The file is read once per process and world size; ``default_selector.cache_clear()``
    reads it again.

    Raises:
        ConfigurationError: ``world_size`` is not a positive integer.
        CalibrationError: the file is malformed.
    """
    # a selector of its own, not selector_for's: constants read at another size's entry compare equal to
    # that size's, and its model's source must still say which entry it came from and why
    return Selector(load_model(world_size=world_size, nodes=nodes))
