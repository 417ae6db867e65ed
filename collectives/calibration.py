"""The calibration file: the cost model's constants per job shape (world size, or nodes x ranks)."""

__all__ = ["CALIBRATION_ENV", "calibration_path", "load_model", "save_model", "shape_key"]

import json
import math
import operator
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

from .errors import CalibrationError, ConfigurationError
from .topology.cost_model import DEFAULT_MODEL, CostModel

CALIBRATION_ENV = "COLLECTIVES_CALIBRATION"
"""The environment variable naming the calibration file, overriding the user cache directory."""


def calibration_path() -> Path:
    """Where the calibrations are read and written.

    ``$COLLECTIVES_CALIBRATION`` if set, else ``$XDG_CACHE_HOME/collectives/calibration.json``,
    else ``~/.cache/collectives/calibration.json``.
    """
    chosen = os.environ.get(CALIBRATION_ENV)
    if chosen:
        return Path(chosen).expanduser()
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home) / "collectives" / "calibration.json"


_ANY_SIZE = "any"  # the entry of a model saved without a world size
_CONSTANTS = ("alpha", "beta", "gamma", "barrier", "copy")
_PER_CALL = ("overhead", "step")  # fitted to whole calls; absent (a file from before them): the defaults
_NETWORK = ("network_alpha", "network_beta")  # the link class between nodes; absent: the defaults


def shape_key(world_size: int, nodes: int = 1) -> str:
    """The entry of ``world_size`` ranks on ``nodes`` nodes: ``"4"`` on one, ``"2x2"`` on two of 2."""
    if nodes <= 1:
        return str(world_size)
    return f"{nodes}x{world_size // nodes}"


def _shape_of(key: str) -> tuple[int, int] | None:
    """``(nodes, ranks per node)`` of a key written by :func:`shape_key` for several nodes, else ``None``."""
    nodes, x, per_node = key.partition("x")
    if not x or not all(_decimal(part) for part in (nodes, per_node)) or int(nodes) < 2:
        return None
    return int(nodes), int(per_node)


def _decimal(text: str) -> bool:
    # written by str(), so "02" or "+2" is no count
    return text.isascii() and text.isdigit() and text == str(int(text)) and text != "0"


def _check_world_size(world_size: object) -> int:
    try:
        size = operator.index(world_size)  # type: ignore[arg-type]  # numpy's integers too
    except TypeError:
        size = 0
    if isinstance(world_size, bool) or size < 1:
        raise ConfigurationError(f"world_size must be a positive integer, got {world_size!r}")
    return size


def _is_world_size(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def _entry_order(key: str) -> tuple[float, int]:
    shape = _shape_of(key)
    if shape is not None:
        return shape[0] * shape[1], shape[0]
    return (math.inf, 0) if key == _ANY_SIZE else (int(key), 1)


def _read_calibrations(path: Path) -> dict[str, dict[str, Any]] | None:
    """The file's calibrations by their entries' keys, each checked; ``None`` if there is no file.

    A file of the old format (one calibration, its constants at the top level) is
    read as the one entry of its ``world_size``, or of ``"any"`` without one.

    Raises:
        CalibrationError: the file cannot be read, is not JSON, or an entry is malformed.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as error:
        raise CalibrationError(f"cannot read calibration {path}: {error}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise CalibrationError(f"malformed calibration {path}: not JSON ({error})") from None
    if not isinstance(data, dict):
        raise CalibrationError(f"malformed calibration {path}: expected a JSON object")
    if "calibrations" not in data:
        size = data.get("world_size")
        if size is not None and not _is_world_size(size):
            raise CalibrationError(
                f"malformed calibration {path}: world_size must be a positive integer, got {size!r}"
            )
        _check_entry(data, f"malformed calibration {path}: ")  # an old file has no entries to name
        return {_ANY_SIZE if size is None else str(size): data}
    entries = data["calibrations"]
    if not isinstance(entries, dict):
        raise CalibrationError(f"malformed calibration {path}: calibrations must be a JSON object")
    for key, entry in entries.items():
        where = f"malformed calibration {path}: entry {key!r}: "
        shape = _shape_of(key)
        if key != _ANY_SIZE and shape is None and not _decimal(key):
            raise CalibrationError(
                f"{where}the key must be a world size (a positive integer), nodes x ranks per node "
                f"(e.g. '2x4') or {_ANY_SIZE!r}"
            )
        if not isinstance(entry, dict):
            raise CalibrationError(f"{where}expected a JSON object")
        size = entry.get("world_size")
        ranks = None if key == _ANY_SIZE else shape[0] * shape[1] if shape else int(key)
        if size is not None and (ranks is None or not _is_world_size(size) or size != ranks):
            raise CalibrationError(f"{where}its world_size is {size!r}")
        _check_entry(entry, where)
    return entries


def _check_entry(entry: dict[str, Any], where: str) -> None:
    """Raise unless ``entry`` has every constant (or none of the later ones) as non-negative seconds."""
    for name in _CONSTANTS:
        value = entry.get(name)
        if name in ("barrier", "copy") and value is None:
            continue  # a calibration from before barriers or copies were measured: the defaults
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise CalibrationError(f"{where}{name} must be a non-negative number of seconds, got {value!r}")
    for name in (*_NETWORK, *_PER_CALL):
        value = entry.get(name)
        if value is None or (name == "overhead" and entry.get("step") is None):
            continue  # not measured (one node, a calibration from before link classes or per-call costs)
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
            raise CalibrationError(f"{where}{name} must be a non-negative number of seconds, got {value!r}")
    _corrections(entry, where)


def _corrections(entry: dict[str, Any], where: str) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    """An entry's measured corrections (:attr:`CostModel.corrections`), checked; none if it has none."""
    kept = entry.get("corrections")
    if kept is None:
        return ()
    problem = f"{where}corrections must map algorithms to [[bytes, measured / predicted], ...], got {kept!r}"
    if not isinstance(kept, dict):
        raise CalibrationError(problem)
    corrections = []
    for algorithm, points in sorted(kept.items()):
        if not isinstance(points, list) or not points:
            raise CalibrationError(problem)
        checked = []
        for point in points:
            if not (isinstance(point, list) and len(point) == 2):
                raise CalibrationError(problem)
            nbytes, ratio = point
            if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 1:
                raise CalibrationError(problem)
            if isinstance(ratio, bool) or not isinstance(ratio, int | float) or not 0 < ratio < math.inf:
                raise CalibrationError(problem)
            checked.append((nbytes, float(ratio)))
        checked.sort()
        if len({b for b, _ in checked}) != len(checked):
            raise CalibrationError(problem)
        corrections.append((str(algorithm), tuple(checked)))
    return tuple(corrections)


def load_model(path: Path | str | None = None, *, world_size: int, nodes: int = 1) -> CostModel:
    """The cost model calibrated for ``world_size`` ranks in the file at ``path`` (:func:`calibration_path`).

    On ``nodes`` nodes (more than one), the entry of that shape (e.g. ``"2x2"``,
    with both classes of link: within a node and between nodes) comes first; without
    one, the entries of world sizes are read as below, with the network's defaults.

    The file keeps one calibration per world size (see :func:`save_model`). The
    entry of ``world_size`` is used; where there is none, the one saved for any
    size (``"any"``); else the entry of the nearest world size, of two as near the
    larger; without a file, :data:`DEFAULT_MODEL`. The model's ``source`` says
    which, e.g. ``"calibrated at 2 ranks, from PATH (none at 4)"``. A file of the
    old format, one calibration at its top level, is read as the entry of its
    ``world_size``, or as ``"any"`` without one.

    Raises:
        ConfigurationError: ``world_size`` is not a positive integer.
        CalibrationError: the file exists but cannot be read or is not JSON, or an
            entry is keyed by no world size or lacks a non-negative, finite
            ``alpha``, ``beta`` or ``gamma``; the message names the path and the entry.
    """
    world_size = _check_world_size(world_size)
    nodes = _check_world_size(nodes)
    path = calibration_path() if path is None else Path(path)
    entries = _read_calibrations(path)
    if not entries:
        return replace(DEFAULT_MODEL, source=f"defaults (no calibration at {path})")
    shape = shape_key(world_size, nodes)
    exact = True  # the entry of this very shape: its measured corrections apply
    if nodes > 1 and shape in entries:
        entry, source = (
            entries[shape],
            f"calibrated on {nodes} nodes of {world_size // nodes} ranks, from {path}",
        )
    elif str(world_size) in entries:
        entry, source = entries[str(world_size)], f"calibrated at {world_size} ranks, from {path}"
        exact = nodes == 1
    elif _ANY_SIZE in entries:
        entry, source = entries[_ANY_SIZE], f"calibrated for any world size, from {path}"
        exact = False
    elif sizes := [int(key) for key in entries if _decimal(key)]:
        # per byte, a calibration at another size on this machine is nearer the truth than the defaults
        nearest = min(sizes, key=lambda size: (abs(size - world_size), -size))
        entry = entries[str(nearest)]
        source = f"calibrated at {nearest} ranks, from {path} (none at {world_size})"
        exact = False
    else:
        # only other shapes of several nodes: their constants within a node still beat the defaults
        key = min(entries, key=lambda k: (abs(_entry_order(k)[0] - world_size), _entry_order(k)))
        entry = entries[key]
        source = f"calibrated on {key} nodes, from {path} (none at {world_size} ranks)"
        exact = False
    if nodes > 1 and shape not in entries:
        source += f" (no calibration of {shape} nodes: the network's defaults)"
    defaults = {"barrier": DEFAULT_MODEL.barrier, "copy": DEFAULT_MODEL.copy}
    alpha, beta, gamma, barrier, copy = (
        float(defaults[name] if entry.get(name) is None else entry[name]) for name in _CONSTANTS
    )
    network_alpha = entry.get("network_alpha")
    network_beta = entry.get("network_beta")
    # before the per-call terms, "overhead" was the exchanges' intercept, kept as a note: not this constant
    fitted = entry.get("step") is not None
    return CostModel(
        alpha,
        beta,
        gamma,
        barrier,
        copy,
        DEFAULT_MODEL.network_alpha if network_alpha is None else float(network_alpha),
        None if network_beta is None else float(network_beta),
        float(entry["overhead"]) if fitted else DEFAULT_MODEL.overhead,
        float(entry["step"]) if fitted else DEFAULT_MODEL.step,
        # measured of one shape's algorithms: another shape's would mislead more than the constants
        _corrections(entry, "") if exact else (),
        source=source,
    )


def save_model(
    model: CostModel,
    path: Path | str | None = None,
    *,
    world_size: int | None = None,
    nodes: int = 1,
    **metadata: Any,
) -> Path:
    """Keep ``model`` and JSON-ready ``metadata`` as the calibration of ``world_size`` ranks; return the path.

    On ``nodes`` nodes (more than one) the entry is that shape's, e.g. ``"2x2"``,
    and keeps the network's constants (``network_alpha``, ``network_beta``) beside
    the node's, and its measured corrections (:attr:`CostModel.corrections`: per
    algorithm, ``[[bytes, measured / predicted], ...]``), which :func:`load_model`
    applies to that very shape alone.

    The file (:func:`calibration_path` by default) keeps one calibration per world
    size, keyed by the size in decimal, each entry the constants in seconds, its
    ``world_size`` and the metadata; saving one replaces only the entry of its size::

        {
          "calibrations": {
            "2": {"alpha": 6e-06, "beta": 2.7e-10, "gamma": 7e-11, "barrier": 5e-06, "copy": 1e-10,
                  "world_size": 2, "host": "...", ...},
            "4": {"alpha": 9e-06, "beta": 6.4e-10, ..., "world_size": 4, ...}
          }
        }

    A model saved without a world size is kept under ``"any"``, which
    :func:`load_model` reads at every size without an entry of its own. Over a file
    of the old format (one calibration at its top level) its calibration is kept as
    the entry of its ``world_size`` (``"any"`` without one). The file is replaced
    atomically, so ranks reading it meanwhile see the old or the new one; of two
    saves at once, only one may be kept.

    Raises:
        ConfigurationError: ``world_size`` is given and is not a positive integer.
        CalibrationError: the file there cannot be read as calibrations (it is left as it is).
    """
    size = None if world_size is None else _check_world_size(world_size)  # an int, as JSON needs
    nodes = _check_world_size(nodes)
    if nodes > 1 and (size is None or size % nodes):
        raise ConfigurationError(f"{size} ranks do not split into {nodes} nodes of equal size")
    key = _ANY_SIZE if size is None else shape_key(size, nodes)
    path = calibration_path() if path is None else Path(path)
    entries = _read_calibrations(path) or {}
    entry: dict[str, Any] = {name: getattr(model, name) for name in (*_CONSTANTS, *_PER_CALL)}
    if nodes > 1:
        entry.update(network_alpha=model.network_alpha, network_beta=model.network_beta, nodes=nodes)
    if model.corrections:
        entry["corrections"] = {name: [list(point) for point in points] for name, points in model.corrections}
    if size is not None:
        entry["world_size"] = size
    entry.update(metadata)
    entries[key] = entry
    calibrations = {key: entries[key] for key in sorted(entries, key=_entry_order)}
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(json.dumps({"calibrations": calibrations}, indent=2) + "\n")
    partial.replace(path)
    return path
