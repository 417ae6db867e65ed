"""Fitting the cost model's constants to timings; no MPI here, so the fits are tested in process."""

__all__ = ["PER_BYTE_TERMS", "Measurement", "Timed", "fit_exchange", "fit_per_byte"]

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from collectives.errors import CalibrationError
from collectives.topology.cost_model import CostModel, Traffic

PER_BYTE_TERMS = {"beta": "elements", "copy": "copied", "network_beta": "network_elements"}
"""The per-byte constants :func:`fit_per_byte` fits, and the :class:`Traffic` field each weighs."""


@dataclass(frozen=True)
class Measurement:
    """One timed exchange: ``steps`` steps, in each of which every rank sends ``nbytes`` to its neighbour."""

    steps: int
    nbytes: int
    seconds: float


@dataclass(frozen=True)
class Timed:
    """One timed collective call, with what the cost model counts for it.

    Attributes:
        algorithm: the algorithm that ran.
        count: elements of the buffer.
        seconds: the call's time.
        traffic: the traffic the selector weighs for it.
    """

    algorithm: str
    count: int
    seconds: float
    traffic: Traffic


def fit_exchange(measurements: Sequence[Measurement]) -> tuple[float, float, float]:
    """``(alpha, beta, overhead)`` from ``seconds = overhead + steps * (alpha + beta * nbytes)``.

    Least squares on relative errors, so that microsecond and millisecond
    timings weigh alike; negative estimates (noise) become zero.
    """
    rows = np.array([[1.0, m.steps, m.steps * m.nbytes] for m in measurements])
    seconds = np.array([m.seconds for m in measurements])
    weights = 1.0 / seconds
    solution, *_ = np.linalg.lstsq(rows * weights[:, None], seconds * weights, rcond=None)
    overhead, alpha, beta = (max(float(v), 0.0) for v in solution)
    return alpha, beta, overhead


def fit_per_byte(
    timed: Sequence[Timed],
    model: CostModel,
    term: str,
    itemsize: int,
    world_size: int,
    ranks_per_node: int | None = None,
) -> tuple[float, float]:
    """``(value, intercept)``: ``term`` (``"beta"`` or ``"copy"``) as the per-byte slope of ``timed``.

    Every other constant of ``model`` is kept: of each call's time, what the other
    terms predict for its traffic is taken off, and the rest is fitted as
    ``intercept + value * bytes``, the bytes the term weighs
    (:data:`PER_BYTE_TERMS`), by least squares on relative errors as
    :func:`fit_exchange`. The intercept takes up the fixed cost of a call and
    whatever the per-message and barrier terms get wrong for these calls (on an
    oversubscribed node the exchanges' alpha was 5 times a ring allreduce's cost
    per message), so the value is the marginal cost of a byte in the algorithms
    timed, in the regime (cache, segments, the executor's own copies) they run
    in. A negative value (noise) becomes zero. With ``ranks_per_node`` the ranks
    span nodes of that many, and each class of link is weighed by its own constants.

    Raises:
        CalibrationError: ``term`` is not one of :data:`PER_BYTE_TERMS`, or the calls
            count fewer than two different numbers of its bytes (no slope to fit).
    """
    field = PER_BYTE_TERMS.get(term)
    if field is None:
        raise CalibrationError(f"cannot fit {term!r}; the per-byte terms are {', '.join(PER_BYTE_TERMS)}")
    nbytes = np.array([getattr(t.traffic, field) * itemsize for t in timed], dtype=float)
    if len(set(nbytes.tolist())) < 2:
        raise CalibrationError(
            f"fitting {term} needs calls of at least two sizes in {field}; got {sorted(set(nbytes.tolist()))}"
        )
    rest = replace(model, **{term: 0.0})
    seconds = np.array([t.seconds for t in timed])
    left = seconds - np.array(
        [sum(rest.terms(t.traffic, itemsize, world_size, ranks_per_node=ranks_per_node)) for t in timed]
    )
    rows = np.stack([np.ones_like(nbytes), nbytes], axis=1)
    weights = 1.0 / seconds
    solution, *_ = np.linalg.lstsq(rows * weights[:, None], left * weights, rcond=None)
    intercept, value = (float(v) for v in solution)
    return max(value, 0.0), intercept
