"""Fitting the cost model's constants to timings (collectives.bench.fitting), in process: no MPI imported."""

import subprocess
import sys

import pytest

from collectives.algorithms import build_schedule
from collectives.algorithms.shared_memory import traffic as shared_traffic
from collectives.bench.fitting import Timed, TimedExchange, fit_exchange, fit_per_byte
from collectives.errors import CalibrationError
from collectives.selector import Selector
from collectives.topology.cost_model import CostModel, Traffic, traffic

_P = 2
_FEATURES = frozenset({"shared_memory"})
_SIZES = (1 << 18, 1 << 20, 1 << 22)  # float32 elements: 1, 4 and 16 MiB
_MODEL = CostModel(alpha=5e-6, beta=0.05e-9, gamma=0.06e-9, barrier=1e-6, copy=0.3e-9)


def _ring(count: int) -> Traffic:
    return traffic(build_schedule("allreduce", "ring", _P, count))


def _shared(count: int) -> Traffic:
    return Traffic(*shared_traffic("allreduce", _P, count, _FEATURES))


def _timed(algorithm: str, count: int, fixed: float, truth: CostModel) -> Timed:
    """A call whose time is ``truth``'s prediction plus ``fixed``."""
    counted = _ring(count) if algorithm == "ring" else _shared(count)
    seconds = fixed + truth.time(counted, 4, _P)
    return Timed(algorithm, count, seconds, counted)


def test_fitting_imports_no_mpi() -> None:
    code = "import sys, collectives.bench.fitting; print('mpi4py' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_copy_is_recovered_as_the_slope_whatever_the_fixed_cost() -> None:
    truth = CostModel(alpha=5e-6, beta=0.05e-9, gamma=0.06e-9, barrier=1e-6, copy=0.08e-9)
    timed = [_timed("shared_memory", n, 40e-6, truth) for n in _SIZES]
    # the model's copy starts wrong (as measured apart); the fit gives the truth back
    copy, intercept = fit_per_byte(timed, _MODEL, "copy", 4, _P)
    assert copy == pytest.approx(0.08e-9, rel=1e-9)
    assert intercept == pytest.approx(40e-6, rel=1e-6)


def test_beta_is_recovered_even_where_alpha_is_wrong() -> None:
    truth = CostModel(alpha=5e-6, beta=0.18e-9, gamma=0.06e-9, barrier=1e-6, copy=0.3e-9)
    timed = [_timed("ring", n, 2e-6, truth) for n in _SIZES]
    # an alpha 30 times too large (exchanges on an oversubscribed node) moves the intercept, not beta
    wrong_alpha = CostModel(alpha=150e-6, beta=0.05e-9, gamma=0.06e-9, barrier=1e-6, copy=0.3e-9)
    beta, intercept = fit_per_byte(timed, wrong_alpha, "beta", 4, _P)
    assert beta == pytest.approx(0.18e-9, rel=1e-9)
    messages = _ring(_SIZES[0]).messages
    assert intercept == pytest.approx(2e-6 - (150e-6 - 5e-6) * messages, rel=1e-6)


def test_the_fitted_model_chooses_what_was_measured_faster() -> None:
    # as measured at 2 ranks: ring 1.4x the shared-memory allreduce's time from a few MiB up
    def measured(algorithm: str, count: int) -> float:
        per_byte = 0.21e-9 if algorithm == "ring" else 0.15e-9
        return 10e-6 + per_byte * count * 4

    timed = [
        Timed(a, n, measured(a, n), _ring(n) if a == "ring" else _shared(n))
        for a in ("ring", "shared_memory")
        for n in _SIZES
    ]
    # constants measured apart (the old calibration) choose ring
    assert Selector(_MODEL).choose("allreduce", _P, 1 << 24, 4, _FEATURES) == "ring"
    beta, ring_rest = fit_per_byte([t for t in timed if t.algorithm == "ring"], _MODEL, "beta", 4, _P)
    copy, shared_rest = fit_per_byte(
        [t for t in timed if t.algorithm == "shared_memory"], _MODEL, "copy", 4, _P
    )
    fitted = CostModel(_MODEL.alpha, beta, _MODEL.gamma, _MODEL.barrier, copy)
    for count in (1 << 20, 1 << 22, 1 << 24):
        ring = fitted.time(_ring(count), 4, _P)
        shared = fitted.time(_shared(count), 4, _P)
        # the predicted difference is the measured one, less the fixed costs the intercepts took
        gap = measured("ring", count) - measured("shared_memory", count)
        assert ring - shared == pytest.approx(gap - (ring_rest - shared_rest), rel=1e-6)
        assert Selector(fitted).choose("allreduce", _P, count, 4, _FEATURES) == "shared_memory"


def test_noise_that_makes_the_slope_negative_gives_zero() -> None:
    counted = [_shared(n) for n in _SIZES[:2]]
    timed = [
        Timed("shared_memory", n, s, c) for n, s, c in zip(_SIZES[:2], (3e-3, 1e-3), counted, strict=True)
    ]
    assert fit_per_byte(timed, _MODEL, "copy", 4, _P)[0] == 0.0


def test_fitting_needs_a_known_term_and_two_sizes() -> None:
    timed = [_timed("ring", n, 0.0, _MODEL) for n in _SIZES]
    with pytest.raises(CalibrationError, match="cannot fit 'gamma'; the per-byte terms are beta, copy"):
        fit_per_byte(timed, _MODEL, "gamma", 4, _P)
    with pytest.raises(CalibrationError, match=r"fitting beta needs calls of at least two sizes"):
        fit_per_byte(timed[:1] * 3, _MODEL, "beta", 4, _P)
    # ring copies nothing through shared memory: no slope of copy in its calls
    with pytest.raises(CalibrationError, match=r"fitting copy needs calls of at least two sizes in copied"):
        fit_per_byte(timed, _MODEL, "copy", 4, _P)


def test_the_exchange_fit_recovers_known_constants_in_process() -> None:
    alpha, beta, overhead = 5e-6, 1e-10, 2e-6
    cases = [TimedExchange(k, b, overhead + k * (alpha + beta * b)) for k in (1, 4) for b in (8, 2**20)]
    assert fit_exchange(cases) == pytest.approx((alpha, beta, overhead), rel=1e-9)
