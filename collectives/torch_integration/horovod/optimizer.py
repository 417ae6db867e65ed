"""Horovod's DistributedOptimizer: an instance of the wrapped optimizer's class that reduces gradients."""

__all__ = ["DistributedOptimizer"]

import contextlib
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ...errors import CollectivesError, InvalidBufferError, UnsupportedOpError
from ..collective_jobs import allreduce_scaled_
from ..mpi_ops import communicator_for
from ..named import named_ops
from ..optimizer import DistributedOptimizer as Engine
from ..optimizer import check_passes_and_predivide, closure_loss, trained
from ..tensors import Comm
from .basics import OPS, Adasum, Average, check_global, size, state
from .compression import Compression

_DEFAULT_FUSION_BYTES = 64 * 2**20
_COMPRESSIONS: dict[Any, str | None] = {Compression.none: None, Compression.fp16: "fp16"}
_adasum_steps = itertools.count()  # names each Adasum step's reduction alike on every rank


class _Distributed(torch.optim.Optimizer):
    """What :func:`DistributedOptimizer` adds to the wrapped optimizer's class (first in the new bases).

    The gradients are reduced by the library's ``DistributedOptimizer`` (the
    engine, wrapping this instance); this face gives it Horovod's class, its
    ``step`` and ``zero_grad`` rules, and Adasum's step.
    """

    _hvd_engine: Engine | None

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        op: str,
        engine_options: dict[str, Any],
        comm: Comm,
    ) -> None:
        # the wrapped optimizer's groups (shared, as Horovod shares them) already hold its hyperparameters
        torch.optim.Optimizer.__init__(self, optimizer.param_groups, optimizer.defaults)
        for key, value in vars(optimizer).items():  # attributes of the optimizer's own class (LBFGS's, ...)
            self.__dict__.setdefault(key, value)
        self.state.update(optimizer.state)
        self._hvd_op = op
        self._hvd_comm = comm
        self._hvd_params = trained(self)
        self._hvd_engine = None
        if op != "adasum":
            self._hvd_engine = Engine(self, named_parameters, op=op, comm=comm, **engine_options)

    def synchronize(self) -> None:
        """Finish reducing this step's gradients; ``.grad`` then holds the results (nothing for Adasum)."""
        if self._hvd_engine is not None:
            self._hvd_engine.synchronize()

    def move_to(self, comm: Comm = None) -> None:
        """Reduce on ``comm`` from now on (``None``: the default, the survivors' after a lost rank).

        Elastic training calls it after a reset; this step's reductions are dropped.
        """
        self._hvd_comm = comm
        if self._hvd_engine is not None:
            self._hvd_engine.move_to(comm)

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Within it, :meth:`step` does not reduce: for a :meth:`synchronize` called just before."""
        with contextlib.nullcontext() if self._hvd_engine is None else self._hvd_engine.skip_synchronize():
            yield

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Reduce the gradients (unless skipped or just done) and take the wrapped optimizer's step."""
        loss = closure_loss(closure)
        if self._hvd_engine is None:
            self._adasum_step()
            return loss
        self._hvd_engine.reduce_before_step(only_new=True)
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
        if self._hvd_engine is not None and self._hvd_engine.gradients_complete:
            raise CollectivesError(
                "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
                "optimizer.synchronize(); the gradients are being reduced"
            )
        super().zero_grad(set_to_none=set_to_none)


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
    ``num_groups`` sets the fusion buckets to about that many (by bytes);
    explicit ``groups`` are checked, and the buckets stay by bytes (the
    results are the same either way).
    """
    check_global(process_set)
    if compression not in _COMPRESSIONS:
        raise ValueError("compression must be hvd.Compression.none or hvd.Compression.fp16")
    del sparse_as_dense  # gradients are made dense in any case
    world = size()
    if op == Adasum and world & (world - 1):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported yet.")
    name = OPS.get(op, str(op))
    if name not in ("avg", "sum", "adasum"):
        raise UnsupportedOpError(f"DistributedOptimizer reduces with Average, Sum or Adasum, not {name!r}")
    check_passes_and_predivide(backward_passes_per_step, gradient_predivide_factor, name)
    owned = trained(optimizer)
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
    options = {
        "fusion_threshold_bytes": threshold,
        "compression": _COMPRESSIONS[compression],
        "backward_passes_per_step": backward_passes_per_step,
        "gradient_predivide_factor": gradient_predivide_factor,
    }
    cls = type(optimizer.__class__.__name__, (_Distributed, optimizer.__class__), {})
    instance: torch.optim.Optimizer = cls(optimizer, named, name, options, state.comm)
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
