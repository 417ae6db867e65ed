"""The calibration file: one calibration per world size, saved, loaded, and checked entry by entry."""

import json
import re
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from collectives.calibration import CALIBRATION_ENV, calibration_path, load_model, save_model
from collectives.errors import CalibrationError, ConfigurationError
from collectives.topology.cost_model import DEFAULT_MODEL, CostModel

pytestmark = pytest.mark.usefixtures("no_calibration_file")


# --- the file


def test_calibration_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CALIBRATION_ENV, str(tmp_path / "mine.json"))
    assert calibration_path() == tmp_path / "mine.json"
    monkeypatch.delenv(CALIBRATION_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert calibration_path() == tmp_path / "cache" / "collectives" / "calibration.json"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert calibration_path() == tmp_path / "home" / ".cache" / "collectives" / "calibration.json"


def test_calibration_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "calibration.json"
    model = CostModel(alpha=1.25e-6, beta=3e-11, gamma=7.5e-11)
    assert save_model(model, path, world_size=2, note="test") == path
    assert json.loads(path.read_text())["calibrations"]["2"]["note"] == "test"
    loaded = load_model(path, world_size=2)
    assert (loaded.alpha, loaded.beta, loaded.gamma) == (1.25e-6, 3e-11, 7.5e-11)
    assert loaded.source == f"calibrated at 2 ranks, from {path}"
    assert [p.name for p in path.parent.iterdir()] == ["calibration.json"]  # no temporary left


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{", "not JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        ('{"alpha": 1e-6, "beta": 1e-9}', "gamma must be a non-negative number of seconds, got None"),
        ('{"alpha": -1e-6, "beta": 1e-9, "gamma": 0}', "alpha must be .* got -1e-06"),
        ('{"alpha": 1e-6, "beta": "fast", "gamma": 0}', "beta must be .* got 'fast'"),
        ('{"alpha": true, "beta": 0, "gamma": 0}', "alpha must be .* got True"),
        ('{"alpha": NaN, "beta": 0, "gamma": 0}', "alpha must be .* got nan"),
        ('{"alpha": 0, "beta": Infinity, "gamma": 0}', "beta must be .* got inf"),
    ],
)
def test_a_malformed_calibration_names_its_path(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(CalibrationError, match=f"malformed calibration {re.escape(str(path))}: {message}"):
        load_model(path, world_size=2)


def test_an_unreadable_calibration_names_its_path(tmp_path: Path) -> None:
    with pytest.raises(CalibrationError, match=f"cannot read calibration {re.escape(str(tmp_path))}"):
        load_model(tmp_path, world_size=2)  # a directory
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(CalibrationError, match=f"cannot read calibration {re.escape(str(binary))}"):
        load_model(binary, world_size=2)


# --- one calibration per world size

# constants distinct per world size, in whole "seconds" so that they round-trip exactly
AT = {size: CostModel(alpha=float(size), beta=10.0 * size, gamma=100.0 * size) for size in (2, 4, 16)}


def _calibrations(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert list(data) == ["calibrations"]
    calibrations: dict[str, Any] = data["calibrations"]
    return calibrations


def test_saving_at_one_size_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    save_model(AT[4], path, world_size=4, host="b")
    save_model(AT[2], path, world_size=2, host="a")
    saved = _calibrations(path)
    assert list(saved) == ["2", "4"]  # in order of size, whatever the order saved
    assert [(e["world_size"], e["host"], e["alpha"]) for e in saved.values()] == [
        (2, "a", 2.0),
        (4, "b", 4.0),
    ]
    # a new calibration at 2 ranks replaces that entry, metadata and all, and only it
    save_model(AT[16], path, world_size=2, note="again")
    again = _calibrations(path)
    assert again["4"] == saved["4"]
    constants = {
        "alpha": 16.0,
        "beta": 160.0,
        "gamma": 1600.0,
        "barrier": AT[16].barrier,
        "copy": AT[16].copy,
        "overhead": 0.0,
        "step": 0.0,
    }
    assert again["2"] == {**constants, "world_size": 2, "note": "again"}
    assert load_model(path, world_size=2) == AT[16] and load_model(path, world_size=4) == AT[4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["calibration.json"]  # no temporary left


@pytest.mark.parametrize(
    ("world_size", "used", "missing"),
    [
        (2, 2, False),
        (4, 4, False),
        (16, 16, False),
        (1, 2, True),
        (3, 4, True),  # as near 2 as 4: the larger
        (5, 4, True),
        (8, 4, True),
        (10, 16, True),  # as near 4 as 16: the larger
        (11, 16, True),
        (100, 16, True),
    ],
)
def test_loading_takes_the_entry_of_the_world_size_or_the_nearest(
    tmp_path: Path, world_size: int, used: int, missing: bool
) -> None:
    path = tmp_path / "calibration.json"
    for size, model in AT.items():
        save_model(model, path, world_size=size)
    loaded = load_model(path, world_size=world_size)
    assert loaded == AT[used]
    expected = f"calibrated at {used} ranks, from {path}" + (f" (none at {world_size})" if missing else "")
    assert loaded.source == expected
    assert expected in loaded.describe()


def test_a_model_saved_for_any_size_serves_every_size_without_its_own(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    save_model(AT[2], path, world_size=2)
    save_model(AT[16], path)
    assert list(_calibrations(path)) == ["2", "any"]
    assert "world_size" not in _calibrations(path)["any"]
    assert load_model(path, world_size=2) == AT[2]
    for size in (1, 3, 4):
        loaded = load_model(path, world_size=size)
        assert loaded == AT[16]
        assert loaded.source == f"calibrated for any world size, from {path}"


# a file from before the per-call constants were fitted takes the defaults' (AT's are zero)
_PER_CALL_DEFAULTS = {"overhead": DEFAULT_MODEL.overhead, "step": DEFAULT_MODEL.step}


def test_an_old_file_of_one_calibration_is_read_and_kept_on_save(tmp_path: Path) -> None:
    path = tmp_path / "calibration.json"
    old = {"alpha": 2.0, "beta": 20.0, "gamma": 200.0, "barrier": 3.0, "world_size": 2, "host": "old"}
    path.write_text(json.dumps(old))
    assert load_model(path, world_size=2) == replace(AT[2], barrier=3.0, **_PER_CALL_DEFAULTS)
    assert load_model(path, world_size=2).source == f"calibrated at 2 ranks, from {path}"
    assert load_model(path, world_size=3).source == f"calibrated at 2 ranks, from {path} (none at 3)"
    save_model(AT[4], path, world_size=4)
    assert list(_calibrations(path)) == ["2", "4"]
    assert _calibrations(path)["2"] == old  # kept as it was, metadata and all
    assert (
        load_model(path, world_size=2) == replace(AT[2], barrier=3.0, **_PER_CALL_DEFAULTS)
        and load_model(path, world_size=4) == AT[4]
    )
    # an old file without a world size is read at every size, and kept under "any"
    path.write_text(json.dumps({"alpha": 16.0, "beta": 160.0, "gamma": 1600.0}))
    for size in (1, 2, 5):
        loaded = load_model(path, world_size=size)
        assert (
            loaded == replace(AT[16], **_PER_CALL_DEFAULTS)
            and loaded.source == f"calibrated for any world size, from {path}"
        )
    save_model(AT[2], path, world_size=2)
    assert list(_calibrations(path)) == ["2", "any"]
    assert (
        load_model(path, world_size=4) == replace(AT[16], **_PER_CALL_DEFAULTS)
        and load_model(path, world_size=2) == AT[2]
    )


_GOOD = {"alpha": 1e-6, "beta": 1e-9, "gamma": 0}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"calibrations": [_GOOD]}, "calibrations must be a JSON object"),
        ({"calibrations": {"2": _GOOD, "4": [1]}}, "entry '4': expected a JSON object"),
        ({"calibrations": {"4": {**_GOOD, "beta": -1}}}, "entry '4': beta must be .* got -1"),
        ({"calibrations": {"2": _GOOD, "4": {"alpha": 1e-6}}}, "entry '4': beta must be .* got None"),
        ({"calibrations": {"any": {**_GOOD, "copy": "x"}}}, "entry 'any': copy must be .* got 'x'"),
        ({"calibrations": {"two": _GOOD}}, "entry 'two': the key must be a world size"),
        ({"calibrations": {"02": _GOOD}}, "entry '02': the key must be a world size"),
        ({"calibrations": {"0": _GOOD}}, "entry '0': the key must be a world size"),
        ({"calibrations": {"-2": _GOOD}}, "entry '-2': the key must be a world size"),
        ({"calibrations": {"4": {**_GOOD, "world_size": 2}}}, "entry '4': its world_size is 2"),
        ({"calibrations": {"any": {**_GOOD, "world_size": 2}}}, "entry 'any': its world_size is 2"),
        ({**_GOOD, "world_size": 0}, "world_size must be a positive integer, got 0"),
        ({**_GOOD, "world_size": "2"}, "world_size must be a positive integer, got '2'"),
    ],
)
def test_a_malformed_entry_names_the_path_and_the_entry(
    tmp_path: Path, content: object, message: str
) -> None:
    path = tmp_path / "bad.json"
    text = json.dumps(content)
    path.write_text(text)
    pattern = f"malformed calibration {re.escape(str(path))}: {message}"
    # every entry is checked, whichever is used: a bad file is found at once, not at another size
    with pytest.raises(CalibrationError, match=pattern):
        load_model(path, world_size=2)
    # nor does saving drop what it cannot read
    with pytest.raises(CalibrationError, match=pattern):
        save_model(AT[2], path, world_size=2)
    assert path.read_text() == text


@pytest.mark.parametrize("world_size", [0, -1, True, 2.0, "2", None])
def test_the_world_size_to_load_or_save_is_checked(tmp_path: Path, world_size: Any) -> None:
    path = tmp_path / "calibration.json"
    with pytest.raises(
        ConfigurationError, match=f"world_size must be a positive integer, got {world_size!r}"
    ):
        load_model(path, world_size=world_size)
    if world_size is not None:  # saving without a world size is saving for any
        with pytest.raises(ConfigurationError, match="world_size must be a positive integer"):
            save_model(AT[2], path, world_size=world_size)
    assert not path.exists()
    save_model(AT[4], path, world_size=np.int64(4))  # numpy's integers are world sizes too
    assert _calibrations(path)["4"]["world_size"] == 4 and load_model(path, world_size=np.int64(4)) == AT[4]


def test_calibration_file_carries_the_barrier(tmp_path: Path) -> None:
    path = tmp_path / "c.json"
    save_model(CostModel(1e-6, 2e-10, 3e-10, 4e-6, 5e-11), path, world_size=2)
    assert json.loads(path.read_text())["calibrations"]["2"]["barrier"] == 4e-6
    loaded = load_model(path, world_size=2)
    assert loaded.barrier == 4e-6 and loaded.copy == 5e-11
    # a file from before barriers were measured still loads, with the default barrier
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 2e-10, "gamma": 3e-10}))
    loaded = load_model(path, world_size=2)
    assert loaded.barrier == DEFAULT_MODEL.barrier and loaded.copy == DEFAULT_MODEL.copy
    path.write_text(json.dumps({"alpha": 1e-6, "beta": 2e-10, "gamma": 3e-10, "barrier": -1}))
    with pytest.raises(CalibrationError, match="barrier must be a non-negative number"):
        load_model(path, world_size=2)
