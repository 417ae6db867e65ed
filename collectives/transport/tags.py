"""The tags of the library's messages, in one table so that no two concerns share one."""

__all__ = ["Tag"]

from enum import IntEnum


class Tag(IntEnum):
    """A message's tag on the library's private communicator, by the concern that sends it.

    Messages between two ranks with the same tag match in the order they were
    posted, so each concern whose messages could be in flight at the same time as
    another's has its own. The values are the ones the library has always used.
    """

    DATA = 7
    """The executor's messages: both sides post a step's messages in schedule order, so order matches them."""

    SELECTOR = 8
    """Rank 0's cost model, sent on the first ``algorithm="auto"`` call so that every rank chooses alike."""

    SIGNATURE = 9
    """A call's signature (and the small call's first data travelling with it), checked by the watchdog."""

    IPC_READY = 10
    """CUDA IPC: "a piece of n bytes is in your slot", sender to receiver."""

    IPC_CREDIT = 11
    """CUDA IPC: "the slot is free again", receiver to sender."""

    IPC_SETUP = 12
    """CUDA IPC: the mailboxes' handles, and whether every peer's mailbox opened."""

    IPC_CLOSE = 13
    """CUDA IPC: "I have unmapped your mailbox"."""

    NODES = 14
    """The ranks meet under the watchdog before they find their nodes, which MPI cannot bound.

    Also as a communicator is made, each sending its settings for the others to compare.
    """

    KV_REQUEST = 15
    """The key-value store: a worker's request (push, pull, clock, ...) to a server, found by probing."""

    KV_REPLY = 16
    """The key-value store: a server's answer to a worker."""

    BROKEN = 17
    """"A call of mine did not finish: the communicator is broken", to every peer, found by probing."""

    GROUP = 18
    """torch.distributed's ``new_group``: its members' lists, agreed on before MPI creates the group."""

    TUNER = 19
    """The online tuner: each rank's timings to rank 0, and rank 0's choice back, once per call shape."""

    TIMED_OUT = 20
    """"A call of mine timed out", to every peer; found only by a late rank's call before it returns."""

    CLOCK = 21
    """A trace's clock comparison as a communicator is made: each rank's pings to rank 0, and its replies."""

    POINT_TO_POINT = 1024
    """torch.distributed's ``send``/``recv``: a user's tag ``t`` travels as ``POINT_TO_POINT + t``.

    On the process group's own duplicate where the transport has one (MPI), so
    the user's messages never meet the library's; far above the other tags where
    it shares the library's (a loopback transport).
    """
