"""Persistent allreduces for a training loop's repeated buckets, kept by bucket name, shape and dtype."""

__all__ = ["KEPT", "Repeated", "repeated_for"]

import threading
import weakref
from collections.abc import Hashable
from typing import Any

import torch

from .. import api
from ..persistent import Persistent, allreduce_init
from .tensors import host_view

KEPT = 256
"""Buckets kept per communicator; past it they are forgotten together (the same on every rank)."""


class Repeated:
    """One communicator's persistent in-place allreduces, one per bucket name, shape, dtype and op.

    The key is the same on every rank of a program that reduces its buckets in the
    same order, so every rank misses alike and the init, which is collective,
    pairs up; where a bucket's memory moved (a rank's own affair: a new gradient
    tensor) the kept allreduce is rebound to it locally.

    Attributes:
        inits: persistent allreduces made (each a collective init).
        starts: reductions run through them.
    """

    def __init__(self, communicator: api.Communicator) -> None:
        self._communicator = communicator
        self._kept: dict[tuple[Any, ...], tuple[Persistent, int]] = {}
        self.inits = 0
        self.starts = 0

    def clear(self) -> None:
        """Forget the kept allreduces; on every rank alike, as the next use of each is an init again."""
        self._kept.clear()

    @staticmethod
    def takes(tensor: torch.Tensor) -> bool:
        """Whether ``tensor`` can be reduced through a kept allreduce: a contiguous cpu tensor numpy can view.

        bfloat16 has no numpy type of torch's own; it and device tensors take the plain call.
        """
        return tensor.device.type == "cpu" and tensor.dtype != torch.bfloat16 and tensor.is_contiguous()

    def allreduce_(self, name: Hashable, tensor: torch.Tensor, op: str) -> torch.Tensor:
        """Reduce ``tensor`` in place across the ranks by ``op``, through the allreduce kept for ``name``.

        ``tensor`` must pass :meth:`takes` (on every rank alike).
        """
        key = (name, tuple(tensor.shape), tensor.dtype, op)
        view = host_view(tensor)
        kept = self._kept.get(key)
        if kept is None:
            if len(self._kept) >= KEPT:
                self._kept.clear()
            persistent = allreduce_init(view, op, out=view, comm=self._communicator)
            self.inits += 1
        else:
            persistent, address = kept
            if address != tensor.data_ptr():
                persistent.rebind(view)
        self._kept[key] = (persistent, tensor.data_ptr())
        self.starts += 1
        persistent()
        return tensor


_lock = threading.Lock()
_repeated: "weakref.WeakKeyDictionary[api.Communicator, Repeated]" = weakref.WeakKeyDictionary()


def repeated_for(communicator: api.Communicator) -> Repeated:
    """The kept allreduces of ``communicator`` (made on first use); those of freed communicators go."""
    with _lock:
        for gone in [c for c in _repeated if c.watchdog.freed]:  # their allreduces hold them
            del _repeated[gone]
        repeated = _repeated.get(communicator)
        if repeated is None:
            repeated = _repeated[communicator] = Repeated(communicator)
        return repeated
