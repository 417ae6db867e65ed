"""``sync`` pushpull over colocated servers as collectives: reduce-scatter by partition, all-gather."""

__all__ = ["agree_key", "collective_pushpull"]

import hashlib
import itertools
from typing import Any

import numpy as np

from ..errors import CollectiveTimeout, KeyMismatchError, KVStoreTimeout
from ..ops import ReduceOp
from ._adapter import Channel
from ._wire import key_bytes
from .layout import Partition
from .server import Server


def agree_key(channel: Channel, key: Any) -> None:
    """Check that every worker pushpulls ``key`` in this round: else one key's data would meet another's.

    One small all-gather of each worker's key digest and type. Collective over the workers.

    Raises:
        KeyMismatchError: on every worker, naming this worker's key and the workers whose keys differ.
    """
    from .. import api

    raw = key_bytes(key)
    mine = np.array(
        [int.from_bytes(hashlib.blake2b(raw, digest_size=7).digest(), "little"), raw[0]], np.int64
    )
    try:
        every = api.allgather(mine, comm=channel.comm).reshape(-1, 2)
    except CollectiveTimeout as error:
        raise KVStoreTimeout(
            f"pushpull of key {key!r} on rank {channel.rank}: workers {list(error.peers)} did not take part "
            f"within the timeout ({error})",
            key=key,
            workers=error.peers,
        ) from error
    others = [r for r in range(len(every)) if (every[r] != mine).any()]
    if others:
        kinds = {"i": "int", "s": "str"}
        theirs = sorted({kinds.get(chr(int(every[r][1])), "?") for r in others})
        raise KeyMismatchError(
            f"pushpull of key {key!r} ({type(key).__name__}) on rank {channel.rank}: workers {others} "
            f"pushpulled another key in the same round (of type {', '.join(theirs)})"
        )


def collective_pushpull(
    channel: Channel, server: Server, key: Any, parts: tuple[Partition, ...], op: ReduceOp,
    value: np.ndarray, target: np.ndarray,
) -> None:  # fmt: skip
    """One round of ``key``: every worker's flat ``value`` combined, updated on its servers, into ``target``.

    Where the servers keep the aggregate as it is (``sync`` with no updater or
    optimizer), this is one allreduce, after which each server stores its
    partitions of the result. Otherwise, where the partitions lie in runs in
    rank order (a value cut into at least as many partitions as servers, or
    one partition), each server's run is its share of a reduce-scatter, updated
    there, and the updated runs come back by an all-gather; partitions out of
    rank order go one by one, a reduce to their server and a broadcast from it.
    The collectives combine in a fixed order, so the result has the same bits
    on every rank and every run. Collective over the workers, who are all the ranks.
    """
    from .. import api

    comm, rank = channel.comm, channel.rank
    raw = key_bytes(key)
    try:
        if server.assigns:
            # the stored value simply becomes the aggregate: one allreduce, and each server keeps its part
            api.allreduce(value, op, out=target, comm=comm)
            server.apply_round(raw, [p for p in parts if p.server == rank], target, 0)
            return
        if all(a.server <= b.server for a, b in itertools.pairwise(parts)):
            counts = [0] * channel.size
            for p in parts:
                counts[p.server] += p.hi - p.lo
            held = [p for p in parts if p.server == rank]
            start = held[0].lo if held else 0
            share = target[start : start + counts[rank]]  # reduced, updated and gathered in place
            api.reduce_scatter(value, op, counts=counts, out=share, comm=comm)
            server.apply_round(raw, held, share, start)
            api.allgather(share, counts=counts, out=target, comm=comm)
            return
        for p in parts:
            piece = target[p.lo : p.hi]
            api.reduce(value[p.lo : p.hi], op, root=p.server, out=piece, comm=comm)
            if rank == p.server:
                server.apply_round(raw, [p], piece, p.lo)
            api.broadcast(piece, root=p.server, out=piece, comm=comm)
    except CollectiveTimeout as error:
        if isinstance(error, KVStoreTimeout):
            raise
        raise KVStoreTimeout(
            f"pushpull of key {key!r} on rank {rank}: workers {list(error.peers)} did not take part "
            f"within the timeout ({error})",
            key=key,
            workers=error.peers,
        ) from error
