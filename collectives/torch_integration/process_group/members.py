"""A new group's members agreed on by messages under the group's timeout, before MPI creates it."""

__all__ = ["agree_on_members"]

import time

import numpy as np

from ...communicator import Communicator
from ...errors import CollectiveTimeout, MismatchError
from ...transport.tags import Tag


def agree_on_members(parent: Communicator, ranks: list[int], timeout: float | None) -> None:
    """Check that every member of ``ranks`` is creating this group, with these members in this order.

    ``MPI_Comm_create_group`` and ``MPI_Comm_dup`` cannot be bounded: a member
    creating another group (another ``new_group`` order, other members) would
    leave the others in it for good. So the members first exchange their lists
    over ``parent`` (the default group's communicator, over ``MPI.COMM_WORLD``),
    twice, as :meth:`Communicator.features_in` meets: a rank that timed out
    sends no second message, so a late one times out too.

    Args:
        parent: the communicator over every rank, whose ranks are torch's global ranks.
        ranks: the group's members, as this rank was asked to create it.
        timeout: seconds to wait; the parent's timeout when ``None``.

    Raises:
        MismatchError: on every member that heard of a disagreement, naming each rank's list.
        CollectiveTimeout: a member did not come in time, naming it.
    """
    me, size = parent.rank, parent.size
    peers = [r for r in ranks if r != me]
    if not peers:
        return
    limit = parent.timeout if timeout is None or timeout <= 0 else timeout
    deadline = time.monotonic() + limit
    mine = np.full(size + 1, -1, np.int64)
    mine[0] = len(ranks)
    mine[1 : len(ranks) + 1] = ranks
    theirs = _exchange(parent, mine, peers, (deadline, limit), ranks, "the members")
    lists = {peer: _members(message) for peer, message in theirs.items()}
    differ = {peer: members for peer, members in lists.items() if members != ranks}
    if not differ:
        said_yes = np.ones_like(mine)
        verdicts = _exchange(parent, said_yes, peers, (deadline, limit), ranks, "the members' verdicts")
        if all(v[0] == 1 for v in verdicts.values()):
            return
    # a member whose lists differ says so by sending no verdict: the others time out in that round
    said = "".join(f"; rank {peer} asked for {members}" for peer, members in sorted(differ.items()))
    raise MismatchError(
        f"new_group on rank {me}: the members disagree on the group: rank {me} asked for {ranks}"
        + (said or "; another member was asked for a different group"),
        {"ranks": {str(ranks): (me,), **{str(m): (p,) for p, m in differ.items()}}},
    )


def _members(message: np.ndarray) -> list[int]:
    count = int(message[0])
    return [int(r) for r in message[1 : 1 + count]] if 0 <= count < len(message) else []


def _exchange(
    parent: Communicator,
    mine: np.ndarray,
    peers: list[int],
    bound: tuple[float, float],
    ranks: list[int],
    step: str,
) -> dict[int, np.ndarray]:
    """Send ``mine`` to every peer and receive theirs before ``bound`` (the deadline, the timeout)."""
    transport = parent.transport
    theirs = {peer: np.empty_like(mine) for peer in peers}
    receives = [transport.irecv(theirs[peer], peer, Tag.GROUP) for peer in peers]
    sends = [transport.isend(mine, peer, Tag.GROUP) for peer in peers]
    deadline, limit = bound
    pending = transport.wait_for(receives + sends, max(deadline - time.monotonic(), 0.0))
    if not pending:
        return theirs
    unheard = [i for i in pending if i < len(peers)]
    unsent = [i - len(peers) for i in pending if i >= len(peers)]
    missing = sorted({peers[i] for i in unheard} or {peers[i] for i in unsent})
    # this attempt's messages may still come: its receives cancelled, the parent's communicator kept
    transport.abandon([receives[i] for i in unheard], [sends[i] for i in unsent])
    raise CollectiveTimeout(
        f"new_group({ranks}) on rank {parent.rank}: ranks {missing} did not agree on {step} "
        f"within {limit:g} s; every member must create the same groups in the same order",
        collective="new_group",
        step=step,
        peers=tuple(missing),
    )
