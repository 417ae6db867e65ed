"""What a server does with what it receives: the reducer, the default updaters, and the optimizers."""

__all__ = [
    "SGD",
    "Adam",
    "Optimizer",
    "Updater",
    "accumulate",
    "assign",
    "combine_rows",
    "optimizer_from_spec",
]

import json
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ..errors import ConfigurationError
from ..ops import ReduceOp

Updater = Callable[[Any, np.ndarray, np.ndarray], np.ndarray]
"""``fn(key, received, stored) -> new stored``, run by the server on each partition it holds.

``received`` and ``stored`` are flat arrays of the partition's elements; the
function may update ``stored`` in place and return it.
"""


def assign(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
    """The stored value becomes what was received (``sync``'s default: the round's aggregate)."""
    stored[...] = received
    return stored


def accumulate(op: ReduceOp, reproducible: bool = False) -> Updater:
    """The stored value combined with each push by ``op`` (``async``'s and ``ssp``'s default).

    ``reproducible`` (float sums): the stored value becomes the reproducible sum of its
    value when first pushed to and every push since (:class:`~collectives.ReproducibleSum`),
    whose bits do not depend on the order the pushes arrive in; a value changed by anything
    else (sparse rows, a load) starts the sum again from there.
    """
    from ..backends import backend_for

    def update(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
        backend_for(stored).combine(op, stored, received)
        return stored

    if not reproducible:
        return update
    from ..reproducible_sum import ReproducibleSum

    sums: dict[int, tuple[Any, Any, np.ndarray]] = {}  # by the stored array: it, its sum, the value written

    def update_reproducibly(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
        if not _floats(stored):
            return update(key, received, stored)
        held = sums.get(id(stored))
        if held is None or held[0]() is not stored or not np.array_equal(held[2], stored, equal_nan=True):
            total = ReproducibleSum(like=stored)
            total.add(stored)
        else:
            total = held[1]
        total.add(received)
        total.value(out=stored)
        sums[id(stored)] = (weakref.ref(stored), total, stored.copy())
        return stored

    return update_reproducibly


def _floats(array: np.ndarray) -> bool:
    """Whether a reproducible sum takes ``array``'s dtype (integers sum exactly anyway)."""
    return array.dtype.name in ("float16", "bfloat16", "float32", "float64")


def combine_pushes(pushes: Sequence[np.ndarray], op: ReduceOp, reproducible: bool = False) -> np.ndarray:
    """A sync round's dense pushes combined by ``op`` in worker order (divided by their number for
    ``avg``), into the first; with ``reproducible`` (float sums) their reproducible sum, whose bits
    depend on the pushes alone, not on their order nor on the number of workers."""
    from ..backends import backend_for

    if reproducible and _floats(pushes[0]):
        from ..reproducible_sum import ReproducibleSum

        summed = ReproducibleSum(like=pushes[0])
        for push in pushes:
            summed.add(push)
        result: np.ndarray = summed.value("avg" if op.averages else "sum")
        return result
    total = pushes[0]
    combine = backend_for(total).combine
    for push in pushes[1:]:  # a fixed order: the same bits on every run
        combine(op, total, push)
    if op.averages:
        total /= len(pushes)
    return total


def combine_rows(
    like: np.ndarray, pushes: Sequence["np.ndarray | tuple[np.ndarray, np.ndarray]"], op: ReduceOp
) -> tuple[np.ndarray, np.ndarray]:
    """A round's pushes to a partition of rows ``like``'s shape, combined in worker order.

    A push is the whole partition or (row indices, those rows); the result is the
    rows any worker pushed and their combination (divided by the pushes for ``avg``).
    """
    from ..backends import backend_for

    total = np.zeros_like(like)
    seen = np.zeros(len(total), bool)
    combine = backend_for(total).combine
    for push in pushes:
        ids, values = push if isinstance(push, tuple) else (np.arange(len(total)), push.reshape(total.shape))
        fresh = ~seen[ids]
        total[ids[fresh]] = values[fresh]
        old = ids[~fresh]
        if old.size:
            rows = total[old]
            combine(op, rows, np.ascontiguousarray(values[~fresh]))
            total[old] = rows
        seen[ids] = True
    touched = np.flatnonzero(seen)
    aggregate = total[touched]
    if op.averages:
        aggregate /= len(pushes)
    return touched, aggregate


class Optimizer:
    """An update rule run on the servers' shards: workers push gradients and pull parameters.

    Each partition keeps its own state (momentum, moments), so the rule is the
    same as on the whole array. Subclasses define :meth:`step` and :meth:`spec`.
    """

    name = ""

    def __init__(self, **options: float) -> None:
        self.options = options
        self._state: dict[tuple[Any, int], dict[str, Any]] = {}

    def spec(self) -> str:
        """The optimizer as text, to send to dedicated servers."""
        return json.dumps({"name": self.name, **self.options}, sort_keys=True)

    def partition_state(self, key: Any, part: int) -> dict[str, Any]:
        """The state (momentum, moments, step count) of partition ``part`` of ``key``; empty before a step."""
        return self._state.get((key, part), {})

    def load_partition_state(self, key: Any, part: int, state: dict[str, Any]) -> None:
        """Take ``state`` (from a checkpoint) as partition ``part`` of ``key``'s state."""
        self._state[(key, part)] = state

    def updater(self, part: int) -> Updater:
        """The updater of partition ``part``."""

        def update(key: Any, received: np.ndarray, stored: np.ndarray) -> np.ndarray:
            state = self._state.setdefault((key, part), {})
            self.step(state, received, stored)
            return stored

        return update

    def update_rows(self, key: Any, part: int, rows: np.ndarray, grad: np.ndarray, param: np.ndarray) -> None:
        """Step rows ``rows`` of ``param`` (2-D) with ``grad`` (their gradients) and those rows' state only.

        Scalar state (Adam's step count) is the partition's, counted once per update.
        """
        state = self._state.setdefault((key, part), {})
        view = {name: value.reshape(param.shape)[rows] if isinstance(value, np.ndarray) else value
                for name, value in state.items()}  # fmt: skip
        subset = param[rows]
        self.step(view, np.ascontiguousarray(grad).reshape(subset.shape), subset)
        param[rows] = subset
        for name, value in view.items():
            if isinstance(value, np.ndarray):
                whole = state.get(name)
                if whole is None:
                    whole = state[name] = np.zeros(param.size, value.dtype)
                whole.reshape(param.shape)[rows] = value
            else:
                state[name] = value

    def step(self, state: dict[str, Any], grad: np.ndarray, param: np.ndarray) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """``v = momentum * v + grad (+ weight_decay * param)``; ``param -= lr * v``, as ``torch.optim.SGD``."""

    name = "sgd"

    def __init__(self, lr: float = 0.01, momentum: float = 0.0, weight_decay: float = 0.0) -> None:
        if not lr > 0 or not 0 <= momentum < 1 or weight_decay < 0:
            raise ConfigurationError(
                f"sgd needs lr > 0, 0 <= momentum < 1, weight_decay >= 0; "
                f"got {lr}, {momentum}, {weight_decay}"
            )
        super().__init__(lr=lr, momentum=momentum, weight_decay=weight_decay)

    def step(self, state: dict[str, Any], grad: np.ndarray, param: np.ndarray) -> None:
        lr, momentum, decay = self.options["lr"], self.options["momentum"], self.options["weight_decay"]
        g = grad + decay * param if decay else grad
        if momentum:
            v = state.get("v")
            if v is None:
                v = state["v"] = np.array(g, dtype=param.dtype)
            else:
                v *= momentum
                v += g
            g = v
        param -= np.asarray(lr * g, dtype=param.dtype)


class Adam(Optimizer):
    """Adam (Kingma and Ba), with bias correction, as ``torch.optim.Adam``."""

    name = "adam"

    def __init__(self, lr: float = 1e-3, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> None:
        if not lr > 0 or not 0 <= beta1 < 1 or not 0 <= beta2 < 1 or not eps > 0:
            raise ConfigurationError(
                f"adam needs lr > 0, 0 <= betas < 1, eps > 0; got {lr}, {beta1}, {beta2}, {eps}"
            )
        super().__init__(lr=lr, beta1=beta1, beta2=beta2, eps=eps)

    def step(self, state: dict[str, Any], grad: np.ndarray, param: np.ndarray) -> None:
        o = self.options
        if not state:
            state.update(t=0, m=np.zeros_like(param), v=np.zeros_like(param))
        state["t"] += 1
        m, v, t = state["m"], state["v"], state["t"]
        m *= o["beta1"]
        m += (1 - o["beta1"]) * grad
        v *= o["beta2"]
        v += (1 - o["beta2"]) * grad * grad
        m_hat = m / (1 - o["beta1"] ** t)
        v_hat = v / (1 - o["beta2"] ** t)
        param -= (o["lr"] * m_hat / (np.sqrt(v_hat) + o["eps"])).astype(param.dtype)


_OPTIMIZERS: dict[str, type[Optimizer]] = {"sgd": SGD, "adam": Adam}


def optimizer_from_spec(spec: str) -> Optimizer:
    """The optimizer :meth:`Optimizer.spec` wrote."""
    options = json.loads(spec)
    name = options.pop("name")
    if name not in _OPTIMIZERS:
        raise ConfigurationError(f"unknown optimizer {name!r}; known: {', '.join(sorted(_OPTIMIZERS))}")
    return _OPTIMIZERS[name](**options)
