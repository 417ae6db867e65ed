"""The step level of a trace: each schedule step, its waits, reductions and copies; shared-memory barriers.

Only where ``TRACER.steps`` is on: the executor (:func:`collectives.execute.run`)
runs a plan over the transport and backend of a :class:`StepTracer`, which
records each step (its messages' peers and bytes in ``args``) and inside it each
wait, reduction and copy; a call's barriers of shared memory and its wait for the
other ranks' signatures are recorded by :class:`TracedCall`, the class a call
takes as it opens. The events nest inside their call's on the trace.
"""

__all__ = ["StepTracer", "TracedCall", "nbytes"]

import time
from collections.abc import Sequence
from typing import Any

from ..call import Call
from ..transport.base import Request, SharedMemory, Transport, WrappedTransport
from .recorder import TRACER

_now = time.monotonic


def nbytes(array: Any) -> int:
    """Bytes of a numpy, CuPy or torch array (or a buffer)."""
    size = getattr(array, "nbytes", None)
    if size is not None:
        return int(size)
    if hasattr(array, "element_size"):
        return int(array.element_size() * array.numel())
    return len(memoryview(array).cast("B"))


class _Posted:
    """A request the step tracer handed out: the inner one, and whom and how much it moves."""

    __slots__ = ("bytes", "peer", "request", "sends")

    def __init__(self, request: Request, peer: int, sends: bool, size: int) -> None:
        self.request, self.peer, self.sends, self.bytes = request, peer, sends, size


class _TracedTransport(WrappedTransport):
    """Records each ``waitall`` as a wait event naming its peers and bytes."""

    def isend(self, buffer: Any, dst: int, tag: int) -> Request:
        return _Posted(self._inner.isend(buffer, dst, tag), dst, True, nbytes(buffer))

    def irecv(self, buffer: Any, src: int, tag: int) -> Request:
        return _Posted(self._inner.irecv(buffer, src, tag), src, False, nbytes(buffer))

    def waitall(self, requests: list[Request]) -> None:
        began = _now()
        self._inner.waitall([p.request for p in requests])
        sends = [p for p in requests if p.sends]
        recvs = [p for p in requests if not p.sends]
        name = "send+recv" if sends and recvs else "send" if sends else "recv"
        args = {
            "send_to": [p.peer for p in sends],
            "recv_from": [p.peer for p in recvs],
            "bytes": sum(p.bytes for p in requests),
        }
        TRACER.record((name, began, _now(), args))


class _TracedBackend:
    """The backend with each copy and reduction recorded; everything else as the backend's own."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def copy(self, dst: Any, src: Any) -> None:
        began = _now()
        self._inner.copy(dst, src)
        TRACER.record(("copy", began, _now(), {"bytes": nbytes(dst)}))

    def _reduced(self, method: str, op: Any, dst: Any, *operands: Any) -> None:
        began = _now()
        getattr(self._inner, method)(op, dst, *operands)
        TRACER.record(("reduce", began, _now(), {"bytes": nbytes(dst), "op": op.name}))

    def combine(self, op: Any, dst: Any, src: Any) -> None:
        self._reduced("combine", op, dst, src)

    def combine_after(self, op: Any, dst: Any, src: Any) -> None:
        self._reduced("combine_after", op, dst, src)

    def reduce_into(self, op: Any, dst: Any, a: Any, b: Any) -> None:
        self._reduced("reduce_into", op, dst, a, b)


class StepTracer:
    """One executor run's steps: wraps its transport and backend, and marks where each step begins.

    Attributes:
        transport: the run's transport, its waits recorded.
        backend: the run's backend, its copies and reductions recorded.
    """

    def __init__(self, transport: Transport, backend: Any, buffer: Any) -> None:
        self.transport: Any = _TracedTransport(transport)
        self.backend: Any = _TracedBackend(backend)
        self._item = buffer.itemsize if hasattr(buffer, "itemsize") else buffer.element_size()
        self._open: tuple[int, float, dict[str, Any]] | None = None

    def step(self, index: int, plan: Any) -> None:
        """Step ``index`` of the plan begins (its messages as ``plan.sends`` and ``plan.recvs``)."""
        self.end()
        item = self._item
        args = {
            "sends": [[m.peer, (m.hi - m.lo) * item] for m in plan.sends],
            "recvs": [
                [m.peer, (m.hi - m.lo) * item, "reduce" if m.landing >= 0 else "copy"] for m in plan.recvs
            ],
        }
        self._open = (index, _now(), args)

    def end(self) -> None:
        """The open step ends (the next one begins, or the run is over)."""
        opened = self._open
        if opened is not None:
            index, began, args = opened
            TRACER.record((f"step {index}", began, _now(), args))
            self._open = None


class TracedCall(Call):
    """A call at the step level: its barriers and its wait for the other ranks' signatures are recorded."""

    __slots__ = ()

    def wait(
        self,
        requests: list[Request],
        step: int | str,
        peers: Sequence[Any],
        transport: Transport | None = None,
    ) -> None:
        if isinstance(step, int):  # an executor's step: its StepTracer records it
            super().wait(requests, step, peers, transport)
            return
        began = _now()
        super().wait(requests, step, peers, transport)
        TRACER.record((f"wait for {step}", began, _now(), {"peers": sorted({p.peer for p in peers})}))

    def barrier(
        self, shared: SharedMemory, note: Sequence[int] = (), ranks: tuple[int, ...] | None = None
    ) -> None:
        began = _now()
        signed = self.pending is not None
        super().barrier(shared, note, ranks)
        args: dict[str, Any] = {"signature": signed}
        TRACER.record(("barrier", began, _now(), args))
