"""``explain``: what ``algorithm="auto"`` runs for a call on a communicator, and why.

The selector's explanation (:mod:`collectives.explanation`) weighed as the call
would be: with the node split the communicator found, the candidates a
non-commutative op rules out, what the online tuner measured, and the way device
arrays travel.
"""

__all__ = ["explain"]

from dataclasses import replace
from typing import TYPE_CHECKING

from .communicator import Communicator, communicator_of
from .dispatch import keeps_order
from .explanation import Candidate, Explanation, Rejected
from .host_copy import through_host
from .ops import ReduceOp, itemsize
from .reproducible_cost import reproducible_cost
from .selector import AUTO, default_selector, layout_features, nodes_of

if TYPE_CHECKING:
    from mpi4py import MPI

    from .topology import Topology


def explain(
    collective: str,
    count: int,
    dtype: object = "float32",
    *,
    world_size: int | None = None,
    comm: "Communicator | MPI.Comm | None" = None,
    op: "str | ReduceOp" = "sum",
    topology: "Topology | None" = None,
    device: bool = False,
    ranks_per_node: int | None = None,
    reproducible: bool = False,
) -> Explanation:
    """What ``algorithm="auto"`` runs for ``collective`` of ``count`` elements, and why.

    Nothing is sent: the explanation is this rank's, with the cost model the
    communicator agreed on if it already has (rank 0's), else this process's
    calibration for ``world_size`` ranks. ``print()`` it for a table of every
    algorithm's predicted time. For device arrays, and wherever the communicator
    already has a device path, it also says how device buffers travel (CUDA IPC,
    CUDA-aware MPI or host staging, and why).

    Args:
        collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
        count: elements of the full buffer (allreduce's buffer, reduce_scatter's
            input, allgather's output).
        dtype: the element type, by name (``"float32"``) or as a dtype.
        world_size: the number of ranks; the communicator's size by default.
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        op: the reduction, for the collectives that reduce.
        topology: predict on this machine's links instead (one GPU per rank), as
            :meth:`collectives.selector.Selector.explain` says; the choice is then advice
            for that machine, and what this communicator's ``"auto"`` runs is unchanged.
        device: explain a call on device arrays: they never use the host's shared
            memory, and the explanation names their path (the communicator's once its
            first device call chose it, else as far as is known without asking the ranks);
            an allreduce of at most ``host_copy.DEVICE_THROUGH_HOST_BYTES`` a rank runs on a
            pinned host copy instead, as the host's allreduce, and the explanation says so.
        ranks_per_node: the node layout to assume, as a job of ``world_size`` ranks with
            this many to a node would find it: ``world_size`` or more is one node whose
            ranks share memory (``shared_memory`` is weighed); fewer, dividing it, is
            nodes sharing memory within each (``hierarchical_shared_memory``); 1, or a
            count that does not divide it, shares none. By default the communicator's
            layout once a call found it; with ``world_size`` and no communicator, no
            shared memory.
        reproducible: also say what ``reproducible=True`` costs the call (a float ``sum``
            or ``avg`` of ``allreduce`` or ``reduce_scatter``): the route it takes, each
            step (the exponent codes and their agreement, the conversion, the collective
            that sums the words, with its algorithm and bytes, the rounding back) and the
            predicted time against the plain call's (``Explanation.reproducible``).

    Raises:
        ValueError: ``reproducible`` with ``device`` (it sums numpy arrays), or for another collective.

    Returns:
        Each candidate's prediction, the rejected algorithms with their reasons, and the choice.
    """
    if reproducible and device:
        raise ValueError("reproducible=True sums numpy arrays: there is no device call to explain")
    selector = None
    group = None
    if world_size is None or comm is not None:
        group = communicator_of(comm)
        world_size = group.size if world_size is None else world_size
        selector = group.selector
        features = (
            group.known_features or frozenset()
        )  # as agreed by earlier calls; asking would be collective
    else:
        features = frozenset()
    if ranks_per_node is not None:
        features = layout_features(world_size, ranks_per_node)
    # a small device allreduce runs on a host copy; other device calls never use the host's shared memory
    on_host = device and through_host(collective, AUTO, count * itemsize(dtype))
    device = device and not on_host
    features = frozenset() if device else features
    # the node split the communicator found (the one dispatch uses) gives the job's shape and link classes
    split = nodes_of(world_size, features)
    nodes = 1 if split is None else split[0]
    chooser = selector or default_selector(world_size, nodes)
    explanation = chooser.explain(
        collective, count, dtype, world_size=world_size, op=op, features=features, topology=topology
    )
    if isinstance(op, ReduceOp) and not op.commutative and explanation.op is not None and world_size > 1:
        explanation = _in_rank_order(explanation, features)
    if reproducible:
        checked = True if group is None else bool(group.watchdog.check)
        cost = reproducible_cost(chooser, explanation, features=features, topology=topology, checked=checked)
        explanation = replace(explanation, reproducible=cost)
    if (
        group is not None
        and group.known_features is None
        and ranks_per_node is None
        and world_size == group.size > 1
        and not device
    ):
        note = (
            "the communicator's node split is not known yet (its first collective, or comm.features, "
            "finds it); until then shared memory and nodes are not weighed, and auto may run another"
        )
        explanation = replace(explanation, note=note)
    tuner = None if group is None or world_size != group.size else group.tuner
    if tuner is not None:  # what the online tuner measured for this shape, and chose
        shape = (collective, world_size, count, itemsize(explanation.dtype), features)
        measured, decided = tuner.measured(*shape), tuner.decided(*shape)
        if decided is not None and measured:
            explanation = replace(explanation, measured=measured, choice=decided)
    if on_host:
        route = "a pinned host copy, reduced as host arrays and copied back (an auto allreduce this small)"
        return replace(explanation, device=route)
    path = None if group is None else group.chosen_device_path
    if path is None and not device:
        return explanation
    from .transport.device_path import foresee

    route = path.describe() if path is not None else foresee(None if group is None else group.transport)
    return replace(explanation, device=route)


def _in_rank_order(explanation: Explanation, features: frozenset[str]) -> Explanation:
    """``explanation`` for a non-commutative op: the candidates that combine out of rank order, rejected.

    As a call of contiguous numpy arrays chooses (see :func:`collectives.dispatch.keeps_order`).
    """
    collective, size, count = explanation.collective, explanation.world_size, explanation.count
    on_shared = collective in ("allreduce", "reduce_scatter")
    kept: list[Candidate] = []
    dropped: list[Candidate] = []
    for candidate in explanation.candidates:
        ordered = keeps_order(collective, candidate.algorithm, size, count, None, 0, on_shared, features)
        (kept if ordered else dropped).append(candidate)
    reason = ("combines the ranks' contributions out of rank order, which a non-commutative op needs",)
    rejected = explanation.rejected + tuple(Rejected(c.algorithm, reason) for c in dropped)
    choice = kept[0].algorithm if kept else None
    return replace(explanation, candidates=tuple(kept), rejected=rejected, choice=choice)
