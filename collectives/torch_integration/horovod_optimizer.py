"""Horovod's DistributedOptimizer: an instance of the wrapped optimizer's class that reduces gradients."""

__all__ = ["DistributedOptimizer", "distributed_optimizer"]

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..errors import CollectivesError, InvalidBufferError, UnsupportedOpError
from .collective_jobs import allreduce_scaled_
from .compression import Compression
from .horovod_basics import OPS, Adasum, Average, check_global, size, state
from .mpi_ops import communicator_for
from .named import named_ops
from .optimizer import DistributedOptimizer as Engine
from .tensors import Comm

_DEFAULT_FUSION_BYTES = 64 * 2**20
_adasum_steps = itertools.count()  # names each Adasum step's reduction alike on every rank


class _Distributed(torch.optim.Optimizer):
    """What ``distributed_optimizer`` adds to the wrapped optimizer's class (first in the new bases)."""

    _hvd_engine: Engine | None

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        op: str,
        compression: str | None,
        backward_passes_per_step: int,
        gradient_predivide_factor: float,
        fusion_threshold_bytes: int,
        comm: Comm,
    ) -> None:
        # the wrapped optimizer's groups (shared, as Horovod shares them) already hold its hyperparameters
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)
        for key, value in vars(optimizer).items():  # attributes of the optimizer's own class (LBFGS's, ...)
            self.__dict__.setdefault(key, value)
        self.state.update(optimizer.state)
        self._hvd_op = op
        self._hvd_comm = comm
        self._hvd_passes = backward_passes_per_step
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_should_sync = True
        self._hvd_params = [p for group in self.param_groups for p in group["params"] if p.requires_grad]
        self._hvd_seen = [0] * len(self._hvd_params)
        self._hvd_started = False  # a gradient is complete and on its way since the last synchronize
        self._hvd_engine = None
        if op == "adasum":
            return
        for index, param in enumerate(self._hvd_params):  # before the engine's hooks, so they run first
            param.register_post_accumulate_grad_hook(self._hvd_hook(index))
        engine_op = "avg" if op == "avg" and gradient_predivide_factor == 1.0 else "sum"
        self._hvd_engine = Engine(
            self, named_parameters, fusion_threshold_bytes=fusion_threshold_bytes,
            compression=compression, op=engine_op, backward_passes_per_step=backward_passes_per_step,
            comm=comm,
        )  # fmt: skip

    def _hvd_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if param.grad is not None and param.grad.layout != torch.strided:
                param.grad = param.grad.to_dense()  # sparse gradients travel dense: the same average
            self._hvd_seen[index] += 1
            if self._hvd_seen[index] == self._hvd_passes:
                self._hvd_started = True
                if self._hvd_op == "avg" and self._hvd_predivide != 1.0 and param.grad is not None:
                    param.grad.div_(self._hvd_predivide)

        return hook

    def synchronize(self) -> None:
        """Finish reducing this step's gradients; ``.grad`` then holds the results (nothing for Adasum)."""
        if self._hvd_engine is None:
            return
        scaled = self._hvd_op == "avg" and self._hvd_predivide != 1.0
        for param, seen in zip(self._hvd_params, self._hvd_seen, strict=True):
            if scaled and seen < self._hvd_passes and param.grad is not None:
                param.grad.div_(self._hvd_predivide)  # fewer passes than expected: its bucket starts now
        self._hvd_engine.synchronize()
        if self._hvd_op == "avg" and self._hvd_predivide != 1.0:
            size = communicator_for(self._hvd_comm).size
            for param in self._hvd_params:
                if param.grad is not None:
                    param.grad.mul_(self._hvd_predivide / size)
        self._hvd_seen = [0] * len(self._hvd_params)
        self._hvd_started = False

    def move_to(self, comm: Comm = None) -> None:
        """Reduce on ``comm`` from now on (``None``: the default, the survivors' after a lost rank).

        Elastic training calls it after a reset; this step's reductions are dropped.
        """
        self._hvd_comm = comm
        self._hvd_seen = [0] * len(self._hvd_params)
        self._hvd_started = False
        if self._hvd_engine is not None:
            self._hvd_engine.move_to(comm)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, :meth:`step` does not reduce: for a :meth:`synchronize` called just before."""
        self._hvd_should_sync = False
        try:
            yield
        finally:
            self._hvd_should_sync = True

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Reduce the gradients (unless skipped or just done) and take the wrapped optimizer's step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._hvd_op == "adasum":
            self._adasum_step()
            return loss
        if self._hvd_should_sync and (self._hvd_started or any(self._hvd_seen)):
            self.synchronize()
        super().step()
        return loss

    def _adasum_step(self) -> None:
        """Step locally, then combine the ranks' parameter changes by Adasum, as Horovod does."""
        with torch.no_grad():
            before = [p.detach().clone() for p in self._hvd_params]
            super().step()
            deltas = [p.detach() - b for p, b in zip(self._hvd_params, before, strict=True)]
            communicator = communicator_for(self._hvd_comm)
            future = named_ops(communicator).submit(
                f"adasum_step.{next(_adasum_steps)}",
                lambda comm: allreduce_scaled_(deltas, "adasum", 1.0, 1.0, comm),
            )
            future.result()
            for param, start, delta in zip(self._hvd_params, before, deltas, strict=True):
                param.copy_(start + delta)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the gradients; an error between backward and step, while they are being reduced."""
        if self._hvd_started:
            raise CollectivesError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); the gradients are being reduced"
            )
        super().zero_grad(set_to_none=set_to_none)


def distributed_optimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    *,
    op: str = "avg",
    compression: str | None = None,
    backward_passes_per_step: int = 1,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    comm: Comm = None,
) -> torch.optim.Optimizer:
    """A new optimizer of ``optimizer``'s class whose ``step()`` first reduces the gradients over the ranks.

    Args as ``collectives.horovod.DistributedOptimizer``'s, with ``op`` one of
    ``"avg"``, ``"sum"``, ``"adasum"`` and ``compression`` ``None`` or ``"fp16"``.
    ``num_groups`` sets the fusion buckets to about that many (by bytes);
    explicit ``groups`` are checked, and the buckets stay by bytes (the
    results are the same either way).
    """
    if op not in ("avg", "sum", "adasum"):
        raise UnsupportedOpError(f"DistributedOptimizer reduces with Average, Sum or Adasum, not {op!r}")
    if gradient_predivide_factor != 1.0 and op != "avg":
        raise ValueError("gradient_predivide_factor is for op=Average only")
    if gradient_predivide_factor <= 0:
        raise ValueError(f"gradient_predivide_factor must be positive, got {gradient_predivide_factor}")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step must be at least 1, got {backward_passes_per_step}")
    owned = [p for group in optimizer.param_groups for p in group["params"] if p.requires_grad]
    if isinstance(groups, int):  # Horovod's older spelling of num_groups
        num_groups, groups = groups, None
    threshold = _DEFAULT_FUSION_BYTES
    if num_groups < 0:
        raise ValueError(f"num_groups must be non-negative, got {num_groups}")
    if num_groups > 0:
        total = sum(p.numel() * p.element_size() for p in owned)
        threshold = max(1, -(-total // num_groups))
    if groups is not None:
        if num_groups:
            raise ValueError("pass num_groups or groups, not both")
        _check_groups(groups, owned)
    named = None if named_parameters is None else list(named_parameters)
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    instance: torch.optim.Optimizer = cls(
        optimizer,
        named,
        op,
        compression,
        backward_passes_per_step,
        gradient_predivide_factor,
        threshold,
        comm,
    )
    return instance


def _check_groups(groups: Any, owned: list[torch.Tensor]) -> None:
    known = {id(p) for p in owned}
    seen: set[int] = set()
    for group in groups:
        for param in group:
            if id(param) not in known:
                raise InvalidBufferError(
                    "groups names a tensor that is not one of the optimizer's parameters"
                )
            if id(param) in seen:
                raise InvalidBufferError("groups names a parameter twice")
            seen.add(id(param))


_COMPRESSIONS: dict[Any, str | None] = {Compression.none: None, Compression.fp16: "fp16"}


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer, named_parameters: Any = None, compression: Any = Compression.none,
    backward_passes_per_step: int = 1, op: int = Average, gradient_predivide_factor: float = 1.0,
    num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False, process_set: Any = None,
) -> torch.optim.Optimizer:  # fmt: skip
    """Wrap ``optimizer`` so that ``step()`` first averages the gradients over the ranks, as Horovod's.

    Returns an instance of ``optimizer``'s own class (a subclass made for it)
    sharing its parameter groups and state, with ``synchronize()`` and
    ``skip_synchronize()``. Gradients are reduced in fusion buckets while
    backward runs. ``op``: Average, Sum or Adasum (each rank steps, then the
    parameter changes are combined by Adasum). ``gradient_predivide_factor``
    f: gradients are divided by f before the sum and by size/f after.
    Sparse gradients travel dense whatever ``sparse_as_dense`` says (the same average).
    """
    check_global(process_set)
    if compression not in _COMPRESSIONS:
        raise ValueError("compression must be hvd.Compression.none or hvd.Compression.fp16")
    del sparse_as_dense  # gradients are made dense in any case
    world = size()
    if op == Adasum and world & (world - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    return distributed_optimizer(
        optimizer, named_parameters, op=OPS.get(op, str(op)), compression=_COMPRESSIONS[compression],
        backward_passes_per_step=backward_passes_per_step,
        gradient_predivide_factor=gradient_predivide_factor, num_groups=num_groups, groups=groups,
        comm=state.comm,
    )  # fmt: skip
