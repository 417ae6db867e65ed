"""The ``collectives`` c10d backend's point-to-point calls: send, recv (from any rank) and their batches."""

__all__: list[str] = []

import contextlib
import math
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ... import api
from ...errors import CollectiveTimeout, InvalidBufferError, InvalidRootError, MismatchError, TransportError
from ...transport.base import Transport
from ...transport.tags import Tag
from ..tensors import TORCH_DTYPES
from ..worker import BackgroundWorker
from .base import GroupBase, GroupWork, Staged, checked_args

_HEADER = 2  # a message's byte count and its dtype's number
_DTYPES = [*TORCH_DTYPES, torch.bool]  # a dtype's number on the wire is its place here


class _TensorMessage:
    """A tensor's bytes as one message carries them, with the dtype a receiver checks."""

    def __init__(self, dtype: torch.dtype, data: np.ndarray, tag: int) -> None:
        self.dtype = dtype
        self.data = data
        self.tag = tag

    def header(self) -> np.ndarray:
        return np.array([self.data.nbytes, _DTYPES.index(self.dtype)], np.int64)

    def differs(
        self, header: np.ndarray, src: int, dst: int
    ) -> tuple[str, dict[str, dict[str, tuple[int, ...]]]] | None:
        """How the message from ``src`` that ``header`` announces differs from the tensor of ``dst``."""
        nbytes, number = int(header[0]), int(header[1])
        dtype = _DTYPES[number] if 0 <= number < len(_DTYPES) else f"dtype number {number}"
        if (nbytes, dtype) == (self.data.nbytes, self.dtype):
            return None
        sent, room = f"{nbytes} bytes of {dtype}", f"{self.data.nbytes} bytes of {self.dtype}"
        return (
            f"rank {src} sent {sent}; the tensor on rank {dst} has {room}",
            {"message": {sent: (src,), room: (dst,)}},
        )


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

    Each message is preceded by a header of its byte count and dtype, on the
    same tag (so the two arrive in order), and a receive into a tensor of
    another size or dtype raises :class:`~collectives.MismatchError` naming
    both, rather than completing with part of the data or its bits reread.
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

    def _message(self, tensors: list[torch.Tensor], tag: int, read: bool) -> tuple[Staged, _TensorMessage]:
        if len(tensors) != 1:
            raise InvalidBufferError(f"send and recv take one tensor, got {len(tensors)}")
        if tag < 0:
            raise InvalidBufferError(f"a message's tag is a non-negative integer, got {tag}")
        stage = Staged(checked_args(tensors[0]), read=read)
        return stage, _TensorMessage(stage.tensor.dtype, stage.view.view(np.uint8), Tag.POINT_TO_POINT + tag)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int) -> dist.Work:
        dst = self._peer(dstRank, "destination")
        stage, message = self._message(tensors, tag, read=True)
        header = message.header()
        requests = [self._p2p.isend(buffer, dst, message.tag) for buffer in (header, message.data)]
        what = f"send to rank {dst} (tag {tag})"

        def finish(sent: object = (stage, header)) -> None:  # the bytes sent live until the send ends
            self._wait_for(requests, what, dst)

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int) -> dist.Work:
        src = self._peer(srcRank, "source")
        stage, message = self._message(tensors, tag, read=False)
        # both posted now, in order: the header and data of one message, never of two
        header = np.zeros(_HEADER, np.int64)
        requests = [self._p2p.irecv(buffer, src, message.tag) for buffer in (header, message.data)]
        what = f"recv from rank {src} (tag {tag})"

        def finish() -> int:
            self._receive(requests, header, message, what, src)
            stage.finish()
            return src

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int) -> dist.Work:
        stage, message = self._message(tensors, tag, read=False)
        what = f"recv from any rank (tag {tag})"

        def finish() -> int:
            deadline = time.monotonic() + self._communicator.timeout
            found = self._p2p.probe(message.tag, max(deadline - time.monotonic(), 0.0))
            if found is None:
                raise CollectiveTimeout(
                    f"{what}: no message came in {self._communicator.timeout} s", step=what
                )
            src = found[0]
            header = np.zeros(_HEADER, np.int64)
            requests = [self._p2p.irecv(buffer, src, message.tag) for buffer in (header, message.data)]
            self._receive(requests, header, message, what, src, deadline)
            stage.finish()
            return src

        return GroupWork(self._p2p_waiter.submit(finish), tensors)

    def _receive(
        self,
        requests: list[Any],
        header: np.ndarray,
        message: _TensorMessage,
        what: str,
        src: int,
        deadline: float | None = None,
    ) -> None:
        """Wait for a message's header, check it against the tensor, then wait for its data."""
        self._wait_for(requests[:1], what, src, deadline)
        problem = message.differs(header, src, self.rank())
        if problem is not None:
            # the data still comes (cut to the tensor, or short): taken here, so a later receive never gets it
            with contextlib.suppress(TransportError, CollectiveTimeout):
                self._wait_for(requests[1:], what, src, deadline)
            raise MismatchError(f"{what}: {problem[0]}", problem[1])
        self._wait_for(requests[1:], what, src, deadline)

    def _wait_for(self, requests: list[Any], what: str, peer: int, deadline: float | None = None) -> None:
        timeout = self._communicator.timeout
        left = timeout if deadline is None else max(deadline - time.monotonic(), 0.0)
        if self._p2p.wait_for(requests, left if math.isfinite(left) else math.inf):
            raise CollectiveTimeout(f"{what} did not finish in {timeout} s", step=what, peers=(peer,))
