"""Measured corrections: what a calibration timed of each algorithm, beyond its fitted constants."""

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from collectives.bench.fitting import Timed, measured_corrections
from collectives.calibration import load_model, save_model
from collectives.errors import CalibrationError
from collectives.selector import Selector
from collectives.topology.cost_model import DEFAULT_MODEL

pytestmark = pytest.mark.usefixtures("no_calibration_file")

_TWO_NODES = frozenset({"shared_memory_nodes", "ranks_per_node=2"})
_RING = ("ring", ((1024, 2.0), (1 << 20, 4.0)))


def test_a_correction_is_the_measured_ratio_at_a_timed_size_and_interpolated_between() -> None:
    model = replace(DEFAULT_MODEL, corrections=(_RING,))
    assert model.correction("ring", 1024) == 2.0
    assert model.correction("ring", 1 << 20) == 4.0
    # geometric in the logarithm of the size: halfway between 2^10 and 2^20 bytes, sqrt(2 * 4)
    assert model.correction("ring", 1 << 15) == pytest.approx(math.sqrt(8.0))
    assert model.correction("ring", 8) == 2.0 and model.correction("ring", 1 << 30) == 4.0  # past the ends
    assert model.correction("butterfly", 4096) == 1.0  # not timed: none


def test_the_selector_weighs_the_corrected_time_and_explain_says_so() -> None:
    features, count = _TWO_NODES, 64 * 1024
    plain = Selector(DEFAULT_MODEL).explain("allreduce", count, world_size=4, features=features)
    first = plain.candidates[0]
    # the model's choice measured three times its prediction: it is no longer the choice
    corrected = replace(DEFAULT_MODEL, corrections=((first.algorithm, ((8, 3.0),)),))
    explanation = Selector(corrected).explain("allreduce", count, world_size=4, features=features)
    again = next(c for c in explanation.candidates if c.algorithm == first.algorithm)
    assert again.time == pytest.approx(3.0 * first.time)
    assert again.correction == 3.0
    assert explanation.choice != first.algorithm
    assert f"{first.algorithm} x3.00" in str(explanation)
    assert "measured corrections for 1 algorithms" in str(explanation)


def test_measured_corrections_are_measured_over_predicted() -> None:
    ranked = {
        c.algorithm: c.traffic for c in Selector(DEFAULT_MODEL).ranked("allreduce", 4, 256, 4, _TWO_NODES)
    }
    predicted = {
        name: sum(DEFAULT_MODEL.terms(ranked[name], 4, 4, ranks_per_node=2)) for name in ("ring", "direct")
    }
    timed = [
        Timed("ring", 256, 2.0 * predicted["ring"], ranked["ring"]),
        Timed("direct", 256, 0.5 * predicted["direct"], ranked["direct"]),
    ]
    corrections = dict(measured_corrections(timed, DEFAULT_MODEL, 4, 4, 2))
    assert corrections["ring"] == ((1024, pytest.approx(2.0)),)
    assert corrections["direct"] == ((1024, pytest.approx(0.5)),)


def test_corrections_round_trip_and_apply_to_their_own_shape_alone(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    model = replace(DEFAULT_MODEL, corrections=(_RING, ("direct", ((8, 0.8),))))
    save_model(model, path, world_size=4, nodes=2)
    save_model(model, path, world_size=4)
    assert dict(load_model(path, world_size=4, nodes=2).corrections) == dict(model.corrections)
    assert dict(load_model(path, world_size=4).corrections) == dict(model.corrections)
    # another shape borrows the constants, not what was measured of the algorithms on this one
    assert load_model(path, world_size=6).corrections == ()
    assert load_model(path, world_size=8, nodes=2).corrections == ()


@pytest.mark.parametrize(
    "corrections",
    [
        [["ring", 2.0]],
        {"ring": []},
        {"ring": [[1024, -1.0]]},
        {"ring": [[0, 1.0]]},
        {"ring": [[1024, "fast"]]},
        {"ring": [[1024, 1.0], [1024, 2.0]]},
    ],
)
def test_malformed_corrections_name_the_entry(tmp_path: Path, corrections: object) -> None:
    path = tmp_path / "calibration.json"
    save_model(DEFAULT_MODEL, path, world_size=2)
    data = json.loads(path.read_text())
    data["calibrations"]["2"]["corrections"] = corrections
    path.write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match=r"entry '2': corrections must map"):
        load_model(path, world_size=2)
