"""Fitting the whole model to timed calls of several algorithms (bench.fitting.fit_model), in process."""

from dataclasses import replace

import pytest

from collectives.bench.fitting import Timed, fit_model
from collectives.errors import CalibrationError
from collectives.selector import Selector
from collectives.topology.cost_model import CostModel

_TWO_NODES = frozenset({"shared_memory_nodes", "ranks_per_node=2"})
_ONE_NODE = frozenset({"shared_memory"})
_SIZES = (2, 8 * 1024, 256 * 1024, 2 * 1024 * 1024)  # float32 elements: 8 B to 8 MiB
_NODE_TERMS = ("overhead", "step", "alpha", "barrier", "beta", "copy")
_ALL_TERMS = (*_NODE_TERMS, "network_alpha", "network_beta")
_TRUTH = CostModel(
    alpha=2e-6,
    beta=0.3e-9,
    gamma=0.02e-9,
    barrier=7e-6,
    copy=0.12e-9,
    network_alpha=9e-6,
    network_beta=0.5e-9,
    overhead=30e-6,
    step=6e-6,
)


def _calls(
    truth: CostModel, algorithms: tuple[str, ...], features: frozenset[str], per_node: int | None
) -> list[Timed]:
    """Each algorithm's allreduce at each size, timed as ``truth`` predicts it."""
    timed = []
    for count in _SIZES:
        ranked = {c.algorithm: c.traffic for c in Selector(truth).ranked("allreduce", 4, count, 4, features)}
        for name in algorithms:
            seconds = sum(truth.terms(ranked[name], 4, 4, ranks_per_node=per_node))
            timed.append(Timed(name, count, seconds, ranked[name]))
    return timed


def test_the_whole_model_is_recovered_from_calls_across_nodes() -> None:
    names = ("ring", "butterfly", "direct", "halving_doubling", "hierarchical", "hierarchical_shared_memory")
    timed = _calls(_TRUTH, names, _TWO_NODES, 2)
    start = replace(_TRUTH, **dict.fromkeys(_ALL_TERMS, 1e-3))  # only gamma is kept as given
    fitted, residuals = fit_model(timed, start, _ALL_TERMS, 4, 4, 2)
    for term in _ALL_TERMS:
        assert getattr(fitted, term) == pytest.approx(getattr(_TRUTH, term), rel=1e-6), term
    assert set(residuals) == set(names) and all(abs(r) < 1e-9 for r in residuals.values())


def test_a_term_no_call_exercises_keeps_its_value() -> None:
    # without shared memory no call copies or passes a barrier: those two cannot be fitted
    names = ("ring", "butterfly", "direct", "halving_doubling")
    timed = _calls(_TRUTH, names, frozenset(), None)
    start = replace(_TRUTH, barrier=1.0, copy=2.0)
    fitted, _ = fit_model(timed, start, _NODE_TERMS, 4, 4)
    assert (fitted.barrier, fitted.copy) == (1.0, 2.0)
    assert fitted.step == pytest.approx(_TRUTH.step) and fitted.overhead == pytest.approx(_TRUTH.overhead)


def test_no_fitted_constant_is_negative() -> None:
    # calls that cost less per step as they take more steps: the step term would come out negative
    names = ("ring", "butterfly", "direct", "halving_doubling", "shared_memory")
    timed = _calls(_TRUTH, names, _ONE_NODE, None)
    cheaper = [replace(t, seconds=t.seconds - 10e-6 * t.traffic.message_steps) for t in timed]
    fitted, _ = fit_model(cheaper, _TRUTH, _NODE_TERMS, 4, 4)
    assert all(getattr(fitted, term) >= 0 for term in _NODE_TERMS) and fitted.step == 0.0


def test_bad_fits_are_refused() -> None:
    timed = _calls(_TRUTH, ("ring",), _ONE_NODE, None)
    with pytest.raises(CalibrationError, match="cannot fit \\['gamma'\\]"):
        fit_model(timed, _TRUTH, ("gamma",), 4, 4)
    with pytest.raises(CalibrationError, match="fitting 6 terms needs as many calls; got 4"):
        fit_model(timed, _TRUTH, _NODE_TERMS, 4, 4)


def test_one_call_from_a_slow_spell_moves_the_fit_little() -> None:
    names = ("ring", "butterfly", "direct", "halving_doubling", "shared_memory")
    timed = _calls(_TRUTH, names, _ONE_NODE, None)
    # the ring's call of the largest size ran in a slow spell of the machine: 1.5 times its time
    outlier = next(t for t in timed if t.algorithm == "ring" and t.count == _SIZES[-1])
    slow = [replace(t, seconds=t.seconds * 1.5) if t is outlier else t for t in timed]
    fitted, residuals = fit_model(slow, replace(_TRUTH, copy=1.0), _NODE_TERMS, 4, 4)
    assert fitted.copy == pytest.approx(_TRUTH.copy, rel=0.02) and fitted.beta == pytest.approx(
        _TRUTH.beta, rel=0.02
    )
    assert all(abs(r) < 0.02 for r in residuals.values())  # medians: the outlier is one of the ring's four
