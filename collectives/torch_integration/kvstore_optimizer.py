"""KVStoreOptimizer: training through the key-value store, each parameter a key, the optimizer server-side."""

__all__ = ["KVStoreOptimizer", "server_optimizer_of"]

from collections.abc import Callable, Iterable

import numpy as np
import torch

from ..errors import ConfigurationError
from ..kvstore import SGD, Adam, KVStore, Optimizer
from .optimizer import WrappedOptimizer, closure_loss
from .tensors import host_view


def server_optimizer_of(optimizer: torch.optim.Optimizer) -> Optimizer:
    """The store's optimizer that does what ``optimizer`` (``torch.optim.SGD`` or ``Adam``) does.

    The store runs one optimizer for all its keys, so every parameter group must
    have the same settings; options the servers do not have (``nesterov``,
    ``dampening``, ``amsgrad``, Adam's ``weight_decay``, ``maximize``) must be off.

    Raises:
        ConfigurationError: another optimizer, groups that differ, or an option the servers lack.
    """
    kind = type(optimizer).__name__
    settings = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    if any(s != settings[0] for s in settings[1:]):
        raise ConfigurationError(
            f"the store runs one optimizer for every key; {kind}'s {len(settings)} parameter groups differ"
        )
    group = settings[0]
    if group.get("maximize"):
        raise ConfigurationError(f"{kind}(maximize=True) has no server-side equivalent")
    if type(optimizer) is torch.optim.SGD:
        if group.get("nesterov") or group.get("dampening"):
            raise ConfigurationError("the servers' SGD has no nesterov or dampening; pass server_optimizer=")
        return SGD(float(group["lr"]), float(group["momentum"]), float(group["weight_decay"]))
    if type(optimizer) is torch.optim.Adam:
        if group.get("amsgrad") or group.get("weight_decay"):
            raise ConfigurationError("the servers' Adam has no amsgrad, weight_decay; use server_optimizer=")
        beta1, beta2 = (float(b) for b in group["betas"])
        return Adam(float(group["lr"]), beta1, beta2, float(group["eps"]))
    raise ConfigurationError(
        f"no server-side optimizer for {kind}; use torch.optim.SGD or Adam, or pass server_optimizer="
    )


class KVStoreOptimizer(WrappedOptimizer):
    """Trains through a :mod:`collectives.kvstore` store: parameters are keys, the servers run the optimizer.

    On creation (collective over the store's workers) each parameter becomes a
    key named by ``named_parameters`` (worker 0's values win, and every worker's
    parameters are overwritten with them), and the servers get the optimizer
    (``server_optimizer``, else the one ``optimizer`` describes: see
    :func:`server_optimizer_of`). :meth:`step` then pushes every gradient
    (divided by the number of workers, in place, with ``average=True``) and
    pulls the updated parameters straight into the parameters' memory: both
    travel as zero-copy numpy views of the tensors.

    The store's mode decides what a step means:

    * ``sync``: one ``pushpull`` of all keys (over colocated servers a
      reduce-scatter and an all-gather); the servers step once on the sum of
      the round's gradients, so training equals one process on the whole batch.
    * ``async``: push, then pull the current parameters; nobody waits.
    * ``ssp``: push, :meth:`~collectives.kvstore.KVStore.clock`, then pull, which
      at clock c waits for every worker's pushes of clocks <= c - staleness - 1.

    In ``async`` and ``ssp`` the servers step once per push, on that push's
    share of the gradient. The local optimizer is never stepped and holds no
    state; the servers' state is saved by ``kv.save``.

    Args:
        optimizer: a ``torch.optim`` optimizer over the parameters (its settings
            describe the servers' optimizer), or the parameters themselves with
            ``server_optimizer``.
        kv: a store, on a worker rank.
        named_parameters: ``model.named_parameters()``: the keys. The same names,
            in the same order, on every worker; ``param<i>`` without it.
        server_optimizer: the store's optimizer, instead of one made from ``optimizer``.
        average: divide each gradient by the number of workers before pushing,
            so the servers see the gradient of the mean loss; ``False`` pushes
            each gradient as it is (the servers see their sum).
        loaded: the store was loaded from a checkpoint (``kv.load``): its keys,
            values and optimizer state are kept, and the parameters pulled from it.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer | Iterable[torch.Tensor],
        kv: KVStore,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
        *,
        server_optimizer: Optimizer | None = None,
        average: bool = True,
        loaded: bool = False,
    ) -> None:
        if not isinstance(optimizer, torch.optim.Optimizer):
            if server_optimizer is None:
                raise ConfigurationError("KVStoreOptimizer over bare parameters needs server_optimizer=")
            optimizer = torch.optim.Optimizer(list(optimizer), {})
        if kv.role != "worker":
            raise ConfigurationError(f"rank {kv.rank} is a dedicated server; train on the worker ranks")
        chosen = server_optimizer if server_optimizer is not None else server_optimizer_of(optimizer)
        super().__init__(optimizer, named_parameters)
        self.kv = kv
        self._average = average
        views = [host_view(p) for p in self._params]
        if not loaded:
            kv.init(self._names, views)
        kv.pull(self._names, out=views)  # worker 0's values everywhere, or the checkpoint's
        if not loaded:  # a loaded store keeps its optimizer and that optimizer's state
            kv.set_optimizer(chosen)

    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        """Push every gradient, then pull every parameter, as the store's mode says; a closure runs first.

        A parameter without a gradient pushes zeros.
        """
        loss = closure_loss(closure)
        grads = [self._gradient(p) for p in self._params]
        params = [host_view(p) for p in self._params]
        kv = self.kv
        if kv.mode == "ssp":
            kv.push(self._names, grads)
            kv.clock()
            kv.pull(self._names, out=params)
        else:
            kv.pushpull(self._names, grads, out=params)
        return loss

    def _gradient(self, param: torch.Tensor) -> np.ndarray:
        grad = param.grad
        if grad is None:
            grad = param.grad = torch.zeros_like(param)
        elif not grad.is_contiguous():
            grad = param.grad = grad.contiguous()
        if self._average and self.kv.num_workers > 1:
            grad.div_(self.kv.num_workers)
        return host_view(grad)

    @property
    def keys(self) -> list[str]:
        """The store's key of each parameter, in order."""
        return list(self._names)

    def __repr__(self) -> str:
        kv = self.kv
        return f"KVStoreOptimizer({len(self._names)} keys, mode={kv.mode!r}, workers={kv.num_workers})"
