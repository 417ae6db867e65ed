"""Fitting the cost model's constants to timings; no MPI here, so the fits are tested in process."""

__all__ = ["PER_BYTE_TERMS", "Measurement", "Timed", "fit_exchange", "fit_per_byte"]

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from collectives.errors import CalibrationError
from collectives.selector import CostModel, Traffic

PER_BYTE_TERMS = {"beta": "elements", "copy": "copied"}
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
    timed: Sequence[Timed], model: CostModel, term: str, itemsize: int, world_size: int, overhead: float = 0.0
) -> float:
    """The value of ``term`` (``"beta"`` or ``"copy"``) with which ``model`` best predicts ``timed``.

    Every other constant of ``model`` is kept: each call's time, less
    ``overhead`` (the fixed cost of a call, which the model leaves out) and less
    what the other terms predict for its traffic, is put down to the term's bytes
    (:data:`PER_BYTE_TERMS`). Least squares on relative errors, as
    :func:`fit_exchange`; a negative estimate (noise, or the other terms
    overestimated) becomes zero. So the model's prediction for the algorithms
    timed matches their measured times, whatever regime (cache, segments,
    executor's own copies) they run in.

    Raises:
        CalibrationError: ``term`` is not one of :data:`PER_BYTE_TERMS`, or no call counts
            any bytes for it (nothing to fit).
    """
    field = PER_BYTE_TERMS.get(term)
    if field is None:
        raise CalibrationError(f"cannot fit {term!r}; the per-byte terms are {', '.join(PER_BYTE_TERMS)}")
    rest = replace(model, **{term: 0.0})
    nbytes = np.array([getattr(t.traffic, field) * itemsize for t in timed], dtype=float)
    if not nbytes.any():
        raise CalibrationError(f"no timed call counts any {field} for {term}; nothing to fit")
    seconds = np.array([t.seconds for t in timed])
    left = seconds - overhead - np.array([rest.time(t.traffic, itemsize, world_size) for t in timed])
    weights = 1.0 / seconds**2
    value = float(np.sum(weights * left * nbytes) / np.sum(weights * nbytes**2))
    return max(value, 0.0)
