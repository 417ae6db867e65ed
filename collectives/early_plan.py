"""An allreduce's algorithm and plan decided before its ranks agree on the call, and its first messages.

A call whose decisions depend on its signature alone (a named algorithm, or
``"auto"`` once the ranks agreed on the selector) can make them before the
signature goes, so that even its first call sends its first messages with the
signature (small calls over messages: :func:`_fuses`), saving a round trip.
"""

__all__ = ["EarlyPlan", "allreduce_plan", "early_plan"]

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .algorithms import ALGORITHMS, rank_program
from .algorithms.base import required_feature
from .backends import ArrayBackend
from .errors import CollectivesError
from .execute import DEFAULT_SEGMENT_BYTES, ProgramPlan, opening, pack_opening, program_plan
from .ops import ReduceOp
from .selector import AUTO
from .watchdog import FUSED_BYTES, PackedSignature

if TYPE_CHECKING:
    from .communicator import Communicator


def allreduce_plan(
    group: "Communicator", algorithm: str, count: int, item_bytes: int, separate: bool
) -> ProgramPlan:
    """This rank's plan of an allreduce by ``algorithm`` (a name, not ``"auto"``), from its program alone."""
    program = rank_program("allreduce", algorithm, group.size, count, rank=group.rank)
    return program_plan(program, max(DEFAULT_SEGMENT_BYTES // item_bytes, 1), separate)


@dataclass(slots=True, eq=False)
class EarlyPlan:
    """An allreduce's decisions known before its ranks agree on the call, and its first messages.

    Attributes:
        algorithm: the algorithm that runs (a name, not ``"auto"``).
        plan: this rank's plan; ``None`` where the shared-memory executor runs the call.
        guard: the call's packed signature, with room for the data that travels with it.
        sends: the first sends that travel with the signature.
        outgoing: per peer, their data, packed already.
        arrived: per peer, where the first receives that travel with the signature land.
    """

    algorithm: str
    plan: ProgramPlan | None
    guard: PackedSignature
    sends: tuple[Any, ...]
    outgoing: dict[int, Any]
    arrived: dict[int, Any] | None


def early_plan(
    group: "Communicator",
    *,
    check: bool | None,
    algorithm: str,
    backend: ArrayBackend,
    op: ReduceOp,
    work: Any,
    source: Any,
    item_bytes: int,
) -> EarlyPlan | None:
    """An allreduce's decisions and first messages, where they are known before the ranks agree on the call.

    Small calls' first messages travel with the signature (see :func:`_fuses`),
    packed here from ``source`` (``work`` where ``None``).
    """
    if not op.commutative:
        return None  # its algorithm is chosen among those that keep the ranks' order, once agreed
    count = work.size
    early = _plan_early(group, algorithm, count, item_bytes, source is not None, backend)
    if early is None:
        return None
    chosen, plan = early
    fused = plan is not None and _fuses(group, check, count * item_bytes, backend)
    sends, recvs = opening(plan) if plan is not None and fused else ((), ())
    payloads = {m.peer: (m.hi - m.lo) * item_bytes for m in sends}
    watchdog = group.watchdog
    dtype = backend.dtype_name(work)
    guard = watchdog.signature_of(
        "allreduce", algorithm, count, dtype, op.agreed_name, backend=backend.name, payloads=payloads
    )
    outgoing = {peer: backend.from_bytes(view, work) for peer, view in guard.outgoing.items()}
    arrived = None
    if sends or recvs:
        pack_opening(sends, backend, work, source, outgoing)
        arrived = {
            m.peer: backend.from_bytes(watchdog.arrived(m.peer, (m.hi - m.lo) * item_bytes), work)
            for m in recvs
        }
    return EarlyPlan(chosen, plan, guard, sends, outgoing, arrived)


def _plan_early(
    group: "Communicator", algorithm: str, count: int, item_bytes: int, separate: bool, backend: ArrayBackend
) -> tuple[str, ProgramPlan | None] | None:
    """The algorithm and plan, when they are known before the ranks agree on the call.

    They are for a named algorithm, or for ``"auto"`` once the ranks have agreed on
    the selector (the first ``"auto"`` call sends messages to agree, which must wait
    until the call's signature is checked), and only for an algorithm that runs a
    schedule over the transport (the plan), or that runs on the shared-memory
    executor once the ranks have set it up (no plan). Whether they are known
    depends on the signature alone, so the ranks of a matching call all know them
    or all do not.
    """
    features = group.known_features  # asking for them may be collective, which must wait for the check too
    if algorithm == AUTO:
        selector = group.selector
        if selector is None or features is None:
            return None
        tuner = group.tuner
        if tuner is None:
            algorithm = selector.choose("allreduce", group.size, count, item_bytes, features)
        else:  # still tuning: chosen once the ranks agree on the call
            decided = tuner.decided("allreduce", group.size, count, item_bytes, features)
            if decided is None:
                return None
            algorithm = decided
    needs = required_feature(ALGORITHMS[algorithm])
    if needs is not None:
        # features are set up collectively by the first call that needs them, never before agreeing
        known = features is not None and needs in features and group.shared is not None
        return (algorithm, None) if known and needs == "shared_memory" and backend.name == "numpy" else None
    try:
        return algorithm, allreduce_plan(group, algorithm, count, item_bytes, separate)
    except (CollectivesError, ValueError):
        return None  # raised again once the call has been checked


def _fuses(group: "Communicator", check: bool | None, nbytes: int, backend: ArrayBackend) -> bool:
    """Whether a call's first messages travel with its signature, saving a round trip.

    Only when there is a signature to travel with, and the data is small: a
    receiver keeps room for that much from every peer. The same on every rank of a
    matching call, as its ranks agree on the check and on the count and dtype.
    """
    watchdog = group.watchdog
    checking = watchdog.check if check is None else check
    by_messages = watchdog.shared is None  # else the signature goes through shared memory, without data
    return checking and by_messages and group.size > 1 and nbytes <= FUSED_BYTES and backend.name == "numpy"
