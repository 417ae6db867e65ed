"""DistributedOptimizer: gradients averaged over the ranks in fusion buckets while backward runs."""

__all__ = ["DistributedOptimizer", "fusion_buckets"]

import contextlib
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np
import torch

from .. import api
from ..errors import CollectivesError, InvalidBufferError, UnsupportedDtypeError, UnsupportedOpError
from .mpi_ops import communicator_for
from .tensors import Comm, host_view, reduce_in_place, torch_dtype_name
from .worker import background_worker

_WIRE_DTYPES: dict[str | None, torch.dtype | None] = {
    None: None,
    "fp16": torch.float16,
    "bf16": torch.bfloat16,
}


def fusion_buckets(params: Sequence[torch.Tensor], threshold_bytes: int) -> list[list[int]]:
    """Group parameters into fusion buckets: each bucket's indices into ``params``, in launch order.

    The parameters are taken in reverse order (backward produces the last
    layers' gradients first). A bucket is closed when the next parameter would
    take it past ``threshold_bytes`` or has another dtype, so a parameter larger
    than the threshold is alone, and a threshold of 0 puts every parameter
    alone. Only the parameters' order, sizes and dtypes matter, so every rank
    gets the same buckets.
    """
    if threshold_bytes < 0:
        raise ValueError(f"threshold_bytes must be non-negative, got {threshold_bytes}")
    buckets: list[list[int]] = []
    filled = 0
    for index in reversed(range(len(params))):
        param = params[index]
        nbytes = param.numel() * param.element_size()
        if not buckets or param.dtype != params[buckets[-1][0]].dtype or filled + nbytes > threshold_bytes:
            buckets.append([])
            filled = 0
        buckets[-1].append(index)
        filled += nbytes
    return buckets


class _Bucket:
    """The parameters of one fusion bucket, and the buffers their gradients travel in."""

    def __init__(
        self, params: list[torch.Tensor], wire: torch.dtype | None, index: int = 0, reproducible: bool = False
    ) -> None:
        self.params = params
        self.wire = wire
        self.reproducible = reproducible
        self.index = index  # the same on every rank
        self._fused: torch.Tensor | None = None
        self._packed: torch.Tensor | None = None

    def reduce(self, op: str, communicator: api.Communicator) -> None:
        """Reduce the gradients in place across the ranks; runs on the communication thread."""
        grads = [p.grad for p in self.params if p.grad is not None]
        if len(grads) < len(self.params):
            raise CollectivesError("a gradient went missing before it was reduced; was zero_grad() called?")
        if self.wire is None and len(grads) == 1 and grads[0].is_contiguous():
            self._reduce(grads[0], op, communicator)  # one gradient needs no fusion buffer
            return
        if self._fused is None:
            self._fused = torch.empty(sum(p.numel() for p in self.params), dtype=self.params[0].dtype)
        fused = self._fused
        bounds = np.cumsum([0] + [p.numel() for p in self.params]).tolist()
        pieces = [fused[lo:hi] for lo, hi in itertools.pairwise(bounds)]
        for piece, grad in zip(pieces, grads, strict=True):
            piece.copy_(grad.reshape(-1))
        if self.wire is None:
            self._reduce(fused, op, communicator)
        else:
            if op == "avg":
                fused.div_(communicator.size)  # before the cast, so float16 cannot overflow in the sum
            if self._packed is None:
                self._packed = torch.empty(fused.numel(), dtype=self.wire)
            self._packed.copy_(fused)
            self._reduce(self._packed, "sum", communicator)
            fused.copy_(self._packed)
        for piece, grad in zip(pieces, grads, strict=True):
            grad.copy_(piece.view_as(grad))

    def _reduce(self, tensor: torch.Tensor, op: str, communicator: api.Communicator) -> None:
        """Reduce ``tensor`` in place (its repeats through the repeat room, as any call's)."""
        if self.reproducible:  # a host copy of a device tensor: the reproducible sum takes numpy arrays
            host = tensor if tensor.device.type == "cpu" else tensor.cpu()
            view = host_view(host)
            api.allreduce(view, op, out=view, comm=communicator, reproducible=True)
            if host is not tensor:
                tensor.copy_(host)
        else:
            reduce_in_place(tensor, op, communicator)


class WrappedOptimizer(torch.optim.Optimizer):
    """An optimizer sharing another's parameter groups and state: schedulers, state dicts work on either.

    What :class:`DistributedOptimizer` and :class:`~.kvstore_optimizer.KVStoreOptimizer` have in common:
    also the parameters they move, named (:func:`parameters_to_reduce`).
    """

    def __init__(
        self, optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
    ) -> None:
        self._names, self._params = parameters_to_reduce(optimizer, named_parameters)
        super().__init__(optimizer.param_groups, optimizer.defaults)  # the same group dicts, shared
        self.optimizer = optimizer
        self.state = optimizer.state

    def state_dict(self) -> dict[str, Any]:
        """The wrapped optimizer's state dict."""
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load into the wrapped optimizer, and share its new groups and state."""
        self.optimizer.load_state_dict(state_dict)
        self.param_groups = self.optimizer.param_groups
        self.state = self.optimizer.state


def closure_loss(closure: Callable[[], float] | None) -> float | None:
    """What an optimizer's ``step(closure)`` returns: the closure's loss, computed with gradients on."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def trained(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters that take gradients, in its groups' order."""
    return [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]


class DistributedOptimizer(WrappedOptimizer):
    """Wraps an optimizer so that ``step()`` uses the gradients averaged over all ranks, as Horovod's does.

    A hook on every parameter hands its gradient over as soon as backward has
    accumulated it. Gradients travel in fusion buckets (:func:`fusion_buckets`:
    reverse registration order, up to ``fusion_threshold_bytes`` each); a
    bucket is reduced on the communication thread once all its gradients are
    ready and every bucket before it has been started, so the buckets go out
    in the same order on every rank while backward goes on with earlier layers.
    :meth:`step` calls :meth:`synchronize`, which starts the buckets backward
    did not fill, waits for all, and leaves the results in ``.grad``; then it
    steps the wrapped optimizer.

    The wrapper shares the wrapped optimizer's ``param_groups`` and ``state``,
    so learning-rate schedulers and state dicts work through either.

    Args:
        optimizer: the optimizer to wrap.
        named_parameters: ``model.named_parameters()``. Their order fixes the
            buckets, so it must be the same on every rank; the optimizer's
            order is used without it.
        fusion_threshold_bytes: the most gradient bytes fused into one
            allreduce; 0 reduces each gradient alone.
        compression: ``None``, ``"fp16"`` or ``"bf16"``: the dtype gradients
            travel in. With ``op="avg"`` they are divided by the world size
            before the cast, so float16 does not overflow in the sum.
        op: ``"avg"`` or ``"sum"`` of the gradients.
        backward_passes_per_step: backward passes that accumulate into
            ``.grad`` before each step; gradients are reduced after the last.
        gradient_predivide_factor: with ``op="avg"``, f: each gradient is
            divided by f before the sum and the sum by size/f after (Horovod's).
        comm: the communicator; the one over ``MPI.COMM_WORLD`` by default.
        reproducible: sum the buckets with ``allreduce(..., reproducible=True)``: the
            bits of the sum over the ranks depend only on their gradients, not on the
            algorithm or the world size (docs/determinism.md).

    Sparse gradients travel dense (the same average). Horovod's
    ``DistributedOptimizer`` (``collectives.horovod``) is a face over this one.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        fusion_threshold_bytes: int = 64 * 2**20,
        compression: str | None = None,
        op: str = "avg",
        backward_passes_per_step: int = 1,
        gradient_predivide_factor: float = 1.0,
        comm: Comm = None,
        reproducible: bool = False,
    ) -> None:
        if compression not in _WIRE_DTYPES:
            raise UnsupportedDtypeError(
                f"unknown compression {compression!r}; valid ones are None, 'fp16', 'bf16'"
            )
        if op not in ("avg", "sum"):
            raise UnsupportedOpError(f"DistributedOptimizer takes op 'avg' or 'sum', not {op!r}")
        check_passes_and_predivide(backward_passes_per_step, gradient_predivide_factor, op)
        super().__init__(optimizer, named_parameters)
        names, params = self._names, self._params
        self._op = op
        self._passes = backward_passes_per_step
        self._predivide = gradient_predivide_factor
        # predivided gradients are summed, then scaled by f / size once all are back
        self._bucket_op = "sum" if gradient_predivide_factor != 1.0 else op
        self._skipping = False
        self._communicator = communicator_for(comm)
        self._worker = background_worker(self._communicator)
        grouping = fusion_buckets(params, fusion_threshold_bytes)
        wire = _WIRE_DTYPES[compression]
        self._buckets = [
            _Bucket([params[i] for i in indices], wire, index, reproducible)
            for index, indices in enumerate(grouping)
        ]
        self._bucket_names = [[names[i] for i in indices] for indices in grouping]
        self._bucket_indices = grouping
        self._bucket_of = [0] * len(params)
        for b, indices in enumerate(grouping):
            for i in indices:
                self._bucket_of[i] = b
        self._lock = threading.Lock()
        self._new_round()
        self._needs_sync = True
        self._hooks = [
            param.register_post_accumulate_grad_hook(self._hook(i))  # type: ignore[no-untyped-call]
            for i, param in enumerate(params)
        ]

    @property
    def buckets(self) -> list[list[str]]:
        """The parameter names of each fusion bucket, in the order the buckets are reduced."""
        return [list(names) for names in self._bucket_names]

    def _new_round(self) -> None:
        self._passes_seen = [0] * len(self._bucket_of)
        self._ready = [0] * len(self._buckets)
        self._started = 0
        self._pending: list[Future[None]] = []

    def _hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if param.grad is not None and param.grad.layout != torch.strided:
                param.grad = param.grad.to_dense()  # sparse gradients travel dense: the same average
            with self._lock:
                self._passes_seen[index] += 1
                passes = self._passes_seen[index]
                if passes > self._passes:
                    raise CollectivesError(
                        f"the gradient of {self._names[index]} was accumulated {passes} times before "
                        f"step() or synchronize(); pass backward_passes_per_step={passes} to accumulate"
                    )
                self._needs_sync = True
                if passes == self._passes:
                    if self._predivide != 1.0 and param.grad is not None:
                        param.grad.div_(self._predivide)
                    self._ready[self._bucket_of[index]] += 1
                    self._start_ready()

        return hook

    def _start_ready(self) -> None:
        # strictly in bucket order: a full bucket waits until every bucket before it has started
        while self._started < len(self._buckets) and self._ready[self._started] == len(
            self._buckets[self._started].params
        ):
            self._start(self._buckets[self._started])

    def _start(self, bucket: _Bucket) -> None:
        op, communicator = self._bucket_op, self._worker.communicator
        self._pending.append(self._worker.submit(lambda: bucket.reduce(op, communicator)))
        self._started += 1

    def synchronize(self) -> None:
        """Reduce what is left of this step's gradients and wait for all; ``.grad`` then holds the results.

        Call it to read or clip the averaged gradients before :meth:`step`,
        which then does not reduce again. A parameter without a gradient
        contributes zeros, and gets the result.
        """
        with self._lock:
            unstarted = zip(
                self._buckets[self._started :], self._bucket_indices[self._started :], strict=True
            )
            for bucket, indices in unstarted:
                for param, index in zip(bucket.params, indices, strict=True):
                    if param.grad is None:
                        param.grad = torch.zeros_like(param)
                    elif self._predivide != 1.0 and self._passes_seen[index] < self._passes:
                        param.grad.div_(self._predivide)  # fewer passes than expected: its bucket starts now
                self._start(bucket)
            pending = self._pending
            self._new_round()
            self._needs_sync = False
        errors = [error for future in pending if (error := future.exception()) is not None]
        if errors:
            raise errors[0]
        if self._predivide != 1.0:
            scale = self._predivide / self._communicator.size
            for bucket in self._buckets:
                for param in bucket.params:
                    if param.grad is not None:
                        param.grad.mul_(scale)

    @property
    def gradients_complete(self) -> bool:
        """Whether a gradient has had all its backward passes since the last :meth:`synchronize`."""
        return any(self._ready)

    def reduce_before_step(self, only_new: bool = False) -> None:
        """What :meth:`step` does first: :meth:`synchronize`, unless it just did or is skipped.

        Args:
            only_new: only where backward handed over a gradient since the last
                synchronize (Horovod's ``step``).
        """
        wanted = any(self._passes_seen) if only_new else self._needs_sync
        if wanted and not self._skipping:
            self.synchronize()

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, :meth:`step` does not reduce: for a :meth:`synchronize` called just before."""
        self._skipping = True
        try:
            yield
        finally:
            self._skipping = False

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Reduce the gradients (unless :meth:`synchronize` just did) and step the wrapped optimizer.

        A closure is called once, before the reduction.
        """
        loss = closure_loss(closure)
        self.reduce_before_step()
        self.optimizer.step()
        self._needs_sync = True
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients as the wrapped optimizer does; an error while they are being reduced."""
        with self._lock:
            if self._pending:
                raise CollectivesError(
                    "zero_grad() was called while gradients were being reduced; call step() or "
                    "synchronize() between backward and zero_grad()"
                )
        self.optimizer.zero_grad(set_to_none=set_to_none)

    def move_to(self, comm: Comm = None) -> None:
        """Reduce on ``comm`` from now on (the survivors' after a rank died), dropping this step's reductions.

        ``None`` is the default communicator as it is now (the survivors' once
        :func:`collectives.resilience.shrink` replaced it).
        """
        with self._lock:
            self._communicator = communicator_for(comm)
            self._worker = background_worker(self._communicator)
            self._new_round()
            self._needs_sync = True

    def remove_hooks(self) -> None:
        """Stop handing gradients over: remove the hooks on the parameters; this wrapper is done with.

        A new :class:`DistributedOptimizer` may then wrap the same optimizer, on
        another communicator (the survivors' after a rank died, say); the old
        hooks would go on reducing on the old one.
        """
        for handle in self._hooks:
            handle.remove()
        self._hooks = []

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Only while wrapping: the buckets are fixed once the wrapper exists."""
        if hasattr(self, "_buckets"):
            raise CollectivesError("DistributedOptimizer cannot take new parameter groups once created")
        super().add_param_group(param_group)

    def __repr__(self) -> str:
        return f"DistributedOptimizer({self.optimizer!r}, buckets={len(self._buckets)}, op={self._op!r})"


def check_passes_and_predivide(passes: int, predivide: float, op: str) -> None:
    """Raise unless ``passes`` is at least 1 and ``predivide`` is positive, and 1 but for ``op="avg"``."""
    if predivide != 1.0 and op != "avg":
        raise ValueError(f"gradient_predivide_factor is for op 'avg' (Horovod's Average) only, not {op!r}")
    if predivide <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {predivide}")
    if passes < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {passes}")


def parameters_to_reduce(
    optimizer: torch.optim.Optimizer, named_parameters: Iterable[tuple[str, torch.Tensor]] | None
) -> tuple[list[str], list[torch.Tensor]]:
    """The optimizer's parameters that take gradients, with names, in registration order; validated."""
    owned = trained(optimizer)
    if named_parameters is None:
        names, params = [f"param{i}" for i in range(len(owned))], owned
    else:
        pairs = list(named_parameters)
        repeated = sorted(name for name, times in Counter(name for name, _ in pairs).items() if times > 1)
        if repeated:
            raise InvalidBufferError(f"named_parameters repeats the names {repeated}")
        wanted = {id(p) for p in owned}
        ordered = [(name, p) for name, p in pairs if id(p) in wanted]
        missing = len(wanted) - len({id(p) for _, p in ordered})
        if missing:
            raise InvalidBufferError(f"{missing} of the optimizer's parameters are not in named_parameters")
        names, params = [name for name, _ in ordered], [p for _, p in ordered]
    devices = sorted({str(p.device) for p in params})
    if len(devices) > 1:
        raise InvalidBufferError(f"the parameters are on several devices ({', '.join(devices)}), not one")
    for name, param in zip(names, params, strict=True):
        if not param.dtype.is_floating_point:
            raise UnsupportedDtypeError(f"parameter {name} has dtype {param.dtype}, not a floating one")
        torch_dtype_name(param.dtype)
        if param.layout != torch.strided:
            raise InvalidBufferError(f"parameter {name} has layout {param.layout}, not a dense one")
        if param.device.type == "cuda":
            raise InvalidBufferError(
                f"parameter {name} is on {param.device}: DistributedOptimizer reduces cpu parameters until "
                "collectives has its GPU backend; use DDP over NCCL for cuda"
            )
        if param.device.type != "cpu":
            raise InvalidBufferError(f"parameter {name} is on device {param.device}, not the cpu")
    return names, params
