"""The ``collectives`` c10d backend's point-to-point calls: send, recv (from any rank) and their batches."""

__all__: list[str] = []

import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .. import api
from ..errors import CollectiveTimeout, InvalidBufferError, InvalidRootError, TransportError
from ..transport.base import Transport
from ..transport.tags import Tag
from .process_group_base import GroupBase, GroupWork, Staged, checked_args
from .worker import BackgroundWorker


class PointToPoint(GroupBase):
    """c10d's ``send``, ``recv`` and ``recv_anysource`` over the transport's own messages.

    A send or receive is posted at once, on the caller's thread (so ``isend``
    and ``irecv`` never wait for each other, as in gloo), and waited for on the
    group's point-to-point thread, no longer than the group's timeout. The
    messages travel on a duplicate of the communicator's transport, made with
    the group (collectively), so they never meet a collective's. A receive from
    any rank probes for the tag on that thread, then receives from the rank
    found; a receive from that rank with the same tag posted meanwhile may take
    the message first, so mix the two on one tag only in an order that cannot.
    Where MPI allows no concurrent calls, each send and receive completes in its
    call instead (then an ``irecv`` must not wait for a later ``isend``).
    """

    def __init__(self, communicator: api.Communicator) -> None:
        super().__init__(communicator)
        duplicate = communicator.transport.duplicate()
        self._p2p_owned = duplicate is not None
        self._p2p: Transport = duplicate if duplicate is not None else communicator.transport
        # where MPI allows no concurrent calls, each send and receive completes in its call
        inline = self._p2p.thread_level in ("funneled", "serialized", "single")
        self._p2p_waiter = BackgroundWorker(inline, communicator)

    def _close_point_to_point(self) -> None:
        self._p2p_waiter.stop()
        if self._p2p_owned:
            self._p2p_owned = False
            self._p2p.close()

    def _peer(self, rank: int, role: str) -> int:
        if not 0 <= rank < self.size():
            raise InvalidRootError(f"the {role} {rank} is not a rank of a group of {self.size()}")
        return rank

    def _message(self, tensors: list[torch.Tensor], tag: int, read: bool) -> tuple[Staged, np.ndarray, int]:
        if len(tensors) != 1:
            raise InvalidBufferError(f"send and recv take one tensor, got {len(tensors)}")
        if tag < 0:
            raise InvalidBufferError(f"a message's tag is a non-negative integer, got {tag}")
        stage = Staged(checked_args(tensors[0]), read=read)
        return stage, stage.view.view(np.uint8), Tag.POINT_TO_POINT + tag

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:
        dst = self._peer(dstRank, "destination")
        stage, data, wire_tag = self._message(tensors, tag, read=True)
        request = self._p2p.isend(data, dst, wire_tag)
        what = f"send to rank {dst} (tag {tag})"

        def finish(sent: object = stage) -> None:  # the bytes sent live until the send ends
            self._wait_for(request, what, dst)

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:
        src = self._peer(srcRank, "source")
        stage, data, wire_tag = self._message(tensors, tag, read=False)
        request = self._p2p.irecv(data, src, wire_tag)
        what = f"recv from rank {src} (tag {tag})"

        def finish() -> int:
            self._wait_for(request, what, src)
            stage.finish()
            return src

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        stage, data, wire_tag = self._message(tensors, tag, read=False)
        what = f"recv from any rank (tag {tag})"

        def finish() -> int:
            deadline = time.monotonic() + self._communicator.timeout
            found = self._p2p.probe(wire_tag, max(deadline - time.monotonic(), 0.0))
            if found is None:
                raise CollectiveTimeout(
                    f"{what}: no message came in {self._communicator.timeout} s", step=what
                )
            src, nbytes = found
            if nbytes != data.nbytes:
                raise TransportError(f"{what}: rank {src} sent {nbytes} bytes for a tensor of {data.nbytes}")
            self._wait_for(self._p2p.irecv(data, src, wire_tag), what, src, deadline)
            stage.finish()
            return src

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def _wait_for(self, request: Any, what: str, peer: int, deadline: float | None = None) -> None:
        timeout = self._communicator.timeout
        left = timeout if deadline is None else max(deadline - time.monotonic(), 0.0)
        if self._p2p.wait_for([request], left if math.isfinite(left) else math.inf):
            raise CollectiveTimeout(f"{what} did not finish in {timeout} s", step=what, peers=(peer,))
