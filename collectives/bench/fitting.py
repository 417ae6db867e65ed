"""Fitting the cost model's constants to timings; no MPI here, so the fits are tested in process."""

__all__ = [
    "FITTED_TERMS",
    "PER_BYTE_TERMS",
    "Timed",
    "TimedExchange",
    "fit_exchange",
    "fit_model",
    "fit_per_byte",
    "measured_corrections",
    "with_terms",
]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from collectives.errors import CalibrationError
from collectives.topology.cost_model import CostModel, Traffic

PER_BYTE_TERMS = {"beta": "elements", "copy": "copied", "network_beta": "network_elements"}
"""The per-byte constants :func:`fit_per_byte` fits, and the :class:`Traffic` field each weighs."""


FITTED_TERMS = ("overhead", "step", "alpha", "network_alpha", "barrier", "beta", "network_beta", "copy")
"""The constants :func:`fit_model` may fit to whole calls (gamma is measured apart, by numpy's sums)."""


@dataclass(frozen=True)
class TimedExchange:
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


def with_terms(model: CostModel, values: Mapping[str, float]) -> CostModel:
    """``model`` with the constants named in ``values`` replaced."""
    fields: dict[str, Any] = dict(values)
    return replace(model, **fields)


def fit_exchange(measurements: Sequence[TimedExchange]) -> tuple[float, float, float]:
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
    rest = with_terms(model, {term: 0.0})
    seconds = np.array([t.seconds for t in timed])
    left = seconds - np.array(
        [sum(rest.terms(t.traffic, itemsize, world_size, ranks_per_node=ranks_per_node)) for t in timed]
    )
    rows = np.stack([np.ones_like(nbytes), nbytes], axis=1)
    weights = 1.0 / seconds
    solution, *_ = np.linalg.lstsq(rows * weights[:, None], left * weights, rcond=None)
    intercept, value = (float(v) for v in solution)
    return max(value, 0.0), intercept


_REWEIGHTINGS = 8
_LEAST_SPREAD = 0.02  # relative errors below 2% weigh as 2%, so that no one call takes over


def _non_negative(
    columns: np.ndarray, target: np.ndarray, weights: np.ndarray, active: list[int]
) -> np.ndarray:
    """Weighted least squares of ``columns @ x = target`` over the ``active`` columns, with ``x >= 0``."""
    active = list(active)
    values = np.zeros(columns.shape[1])
    while active:
        rows = columns[:, active] * weights[:, None]
        solution, *_ = np.linalg.lstsq(rows, target * weights, rcond=None)
        if (solution >= 0).all():
            values[active] = solution
            break
        # drop the most negative and fit the rest again (an active-set step of non-negative least squares)
        active.pop(int(np.argmin(solution)))
    return values


def fit_model(
    timed: Sequence[Timed],
    model: CostModel,
    terms: Sequence[str],
    itemsize: int,
    world_size: int,
    ranks_per_node: int | None = None,
) -> tuple[CostModel, dict[str, float]]:
    """``model`` with ``terms`` fitted together to whole calls, and each algorithm's median relative residual.

    Each call's time is taken to be the model's prediction for its traffic
    (:meth:`CostModel.terms`), linear in every constant, so the constants are one
    least-squares solution over all the calls: each term's column is what the
    model predicts with that constant at 1 and every other at 0; the constants not
    fitted (gamma above all) are kept and their part taken off first. Least
    squares on relative errors, so that calls of microseconds and of milliseconds
    weigh alike. A term that comes out negative (noise, or a term these calls
    cannot tell apart from another) is set to zero and the rest fitted again, so
    every constant is a cost. Fitting them together, over algorithms that differ
    in steps, messages, crossings, barriers and copies, is what lets the model
    rank those algorithms: fitted one at a time, to one algorithm each, every
    constant took up the others' errors (the network's beta came out 2.8 times
    the node's from a ring, where the calls of every algorithm measured them alike).

    Raises:
        CalibrationError: a term is not one of :data:`FITTED_TERMS`, or there are fewer calls than terms.
    """
    unknown = [t for t in terms if t not in FITTED_TERMS]
    if unknown:
        raise CalibrationError(f"cannot fit {unknown}; the fitted terms are {', '.join(FITTED_TERMS)}")
    if len(timed) < len(terms):
        raise CalibrationError(f"fitting {len(terms)} terms needs as many calls; got {len(timed)}")
    zero = with_terms(model, {"network_beta": model.between_beta} | {t: 0.0 for t in terms})

    def predicted(m: CostModel, t: Timed) -> float:
        return sum(m.terms(t.traffic, itemsize, world_size, ranks_per_node=ranks_per_node))

    base = np.array([predicted(zero, t) for t in timed])
    columns = np.array(
        [
            [predicted(with_terms(zero, {term: 1.0}), t) - b for term in terms]
            for t, b in zip(timed, base, strict=True)
        ]
    )
    seconds = np.array([t.seconds for t in timed])
    exercised = [j for j in range(len(terms)) if columns[:, j].any()]
    values = np.zeros(len(terms))
    # least absolute relative error, by reweighting: a call timed in a slow spell of a shared machine
    # (a shared-memory call at 8 MiB once took 1.3x its neighbours' trend) then moves the fit less
    spread = np.ones_like(seconds)
    for _ in range(_REWEIGHTINGS):
        weights = 1.0 / (seconds * np.sqrt(spread))
        values = _non_negative(columns, seconds - base, weights, exercised)
        spread = np.maximum(np.abs(columns @ values + base - seconds) / seconds, _LEAST_SPREAD)
    # a term no call exercises (copy where no memory is shared) keeps the value it was given
    kept = {term: getattr(model, term) for j, term in enumerate(terms) if not columns[:, j].any()}
    fitted = with_terms(zero, {term: float(v) for term, v in zip(terms, values, strict=True)} | kept)
    residual: dict[str, list[float]] = {}
    for t in timed:
        residual.setdefault(t.algorithm, []).append(predicted(fitted, t) / t.seconds - 1.0)
    return fitted, {name: float(np.median(r)) for name, r in residual.items()}


def measured_corrections(
    timed: Sequence[Timed],
    model: CostModel,
    itemsize: int,
    world_size: int,
    ranks_per_node: int | None = None,
) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """Per algorithm, ``(bytes, measured / predicted)`` at each timed size: :attr:`CostModel.corrections`.

    What ``model``'s constants miss of each algorithm on the job timed (on 2 x 2
    emulated nodes they priced ring at half its time): with them, the selector's
    prediction at a timed size is the time measured there, so ``auto`` runs the
    fastest of the calls timed, and between sizes the factor is interpolated. Of
    several calls of one algorithm and size, the median.
    """
    ratios: dict[str, dict[int, list[float]]] = {}
    for t in timed:
        predicted = sum(model.terms(t.traffic, itemsize, world_size, ranks_per_node=ranks_per_node))
        if predicted > 0 and t.seconds > 0:
            nbytes = max(t.count * itemsize, 1)
            ratios.setdefault(t.algorithm, {}).setdefault(nbytes, []).append(t.seconds / predicted)
    return tuple(
        (name, tuple((nbytes, float(np.median(values))) for nbytes, values in sorted(sizes.items())))
        for name, sizes in sorted(ratios.items())
    )
