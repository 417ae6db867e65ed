"""Choosing an algorithm for ``algorithm="auto"`` from an alpha-beta-gamma cost model of its schedule."""

__all__ = [
    "AUTO",
    "CALIBRATION_ENV",
    "DEFAULT_MODEL",
    "NETWORK_ALPHA",
    "Candidate",
    "CostModel",
    "Explanation",
    "Rejected",
    "Selector",
    "Traffic",
    "calibration_path",
    "check_algorithm",
    "default_selector",
    "itemsize",
    "load_model",
    "rejection_reasons",
    "save_model",
    "selector_for",
    "traffic",
]

import json
import math
import operator
import os
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from . import algorithms
from .errors import (
    CalibrationError,
    CollectivesError,
    ConfigurationError,
    TopologyError,
    UnknownAlgorithmError,
)
from .ops import ReduceOp, check_dtype, get_op
from .schedule import Schedule
from .specs import get_spec
from .topology import Prediction, Topology, predict

AUTO = "auto"
"""The algorithm name that asks the selector to choose."""

CALIBRATION_ENV = "COLLECTIVES_CALIBRATION"
"""The environment variable naming the calibration file, overriding the user cache directory."""

_DEFAULT_BARRIER = 5e-6  # see DEFAULT_MODEL
_DEFAULT_COPY = 0.03e-9

_CHOICES_KEPT = 4096  # distinct (collective, world size, count, itemsize) choices remembered per selector


def itemsize(dtype: object) -> int:
    """Bytes per element of a dtype, by name (``"float32"``) or as a numpy-like dtype with a ``name``."""
    name = str(getattr(dtype, "name", dtype))
    check_dtype(name)
    # every supported dtype's name ends in its width in bits
    return int(name.lstrip("abcdefghijklmnopqrstuvwxyz")) // 8


@dataclass(frozen=True)
class Traffic:
    """A schedule's work on its critical path, step by step, as the cost model weighs it.

    Every field sums, over the steps, the most any one rank does in that step;
    transfers of empty chunks are skipped, as the executor skips them.

    Attributes:
        steps: steps that move any data.
        messages: per step, the most messages a rank sends or receives.
        elements: per step, the most elements a rank sends or receives.
        reduced: per step, the most elements a rank reduces.
        barriers: barriers every rank passes (the shared-memory execution's
            synchronisation, in place of messages); none for a schedule of messages.
        copied: elements a rank copies through shared memory (into its region and
            out of the others'), in place of sending them; none for a schedule of messages.
    """

    steps: int
    messages: int
    elements: int
    reduced: int
    barriers: int = 0
    copied: int = 0


def traffic(schedule: Schedule) -> Traffic:
    """Count ``schedule``'s critical-path traffic (see :class:`Traffic`)."""
    sizes = schedule.chunk_sizes
    steps = messages = elements = reduced = 0
    for step in schedule.steps:
        sends: dict[int, int] = {}
        recvs: dict[int, int] = {}
        sent: dict[int, int] = {}
        received: dict[int, int] = {}
        reducing: dict[int, int] = {}
        for t in step.transfers:
            n = sizes[t.chunk]
            if n == 0:
                continue
            sends[t.src] = sends.get(t.src, 0) + 1
            recvs[t.dst] = recvs.get(t.dst, 0) + 1
            sent[t.src] = sent.get(t.src, 0) + n
            received[t.dst] = received.get(t.dst, 0) + n
            if t.reduce:
                reducing[t.dst] = reducing.get(t.dst, 0) + n
        if not sends:
            continue
        steps += 1
        # links are full duplex: a rank's sends and receives overlap, its messages to
        # different peers do not (they share its one CPU and network port)
        messages += max(*sends.values(), *recvs.values())
        elements += max(*sent.values(), *received.values())
        reduced += max(reducing.values(), default=0)
    return Traffic(steps, messages, elements, reduced)


@lru_cache(maxsize=256)
def _on_topology(
    collective: str, algorithm: str, world_size: int, count: int, itemsize: int, topology: Topology
) -> tuple[str, Traffic, Prediction]:
    """A registered algorithm's schedule as built for ``topology``, its traffic and its predicted time.

    A module with ``for_topology(collective, world_size, count, topology)`` builds
    what fits the machine (e.g. multi_ring on its packed rings); any other is
    built as for MPI, rank r on GPU r.
    """
    build = getattr(algorithms.ALGORITHMS[algorithm], "for_topology", None)
    schedule = None if build is None else build(collective, world_size, count, topology)
    if schedule is None:
        schedule = algorithms.build_schedule(collective, algorithm, world_size, count)
    return schedule.name, traffic(schedule), predict(schedule, topology, itemsize)


@lru_cache(maxsize=1024)
def _counted(
    collective: str, algorithm: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> tuple[str, Traffic]:
    """The name and traffic of a registered algorithm's schedule, evenly shared (memoized).

    A module that runs its schedule its own way (``shared_memory``) gives the traffic
    of that execution from ``traffic(collective, world_size, count, features)``.
    """
    schedule = algorithms.build_schedule(collective, algorithm, world_size, count)
    own = getattr(algorithms.ALGORITHMS[algorithm], "traffic", None)
    if own is None:
        return schedule.name, traffic(schedule)
    return schedule.name, Traffic(*own(collective, world_size, count, features))


NETWORK_ALPHA = 20e-6
"""Seconds per message between nodes, charged to every message where the transport spans several nodes.

Not measured (``bench calibrate`` runs on one node): MPI over a cluster network
takes a few microseconds a message on the wire, more through the software of
each side; 20 us is a round figure of that. Per byte the network is taken to be
as fast as memory here, which favours the algorithms that send the most bytes.
"""


@dataclass(frozen=True)
class CostModel:
    """Time of a schedule: per step, alpha per message, beta per byte moved, gamma per byte reduced.

    A step's time is ``alpha * m + beta * b + gamma * r``, where ``m``, ``b`` and
    ``r`` are the most messages, bytes moved and bytes reduced by any rank in the
    step (see :class:`Traffic`); the executor reduces after a step's transfers
    complete, so the terms add. A schedule's time is the sum over its steps. An
    execution through shared memory synchronises by barriers instead of messages,
    each costing ``barrier * (P - 1)``: a rank waits for the arrival of each of the
    P - 1 others, and on a busy node for each of them to be scheduled; and it copies
    bytes once, at ``copy`` per byte, where a message over MPI's shared memory
    copies them twice (into a shared cell and out) and pays MPI's software besides.

    Attributes:
        alpha: seconds per message (latency and per-message software overhead).
        beta: seconds per byte a rank sends or receives (the inverse bandwidth).
        gamma: seconds per byte a rank reduces.
        barrier: seconds per shared-memory barrier and per peer it waits for.
        copy: seconds per byte a rank copies through shared memory.
        source: where the constants came from, for explanations.
    """

    alpha: float
    beta: float
    gamma: float
    barrier: float = _DEFAULT_BARRIER
    copy: float = _DEFAULT_COPY
    source: str = field(default="given", compare=False)

    def barrier_time(self, world_size: int) -> float:
        """Seconds of one shared-memory barrier over ``world_size`` ranks."""
        return self.barrier * max(world_size - 1, 0)

    def time(self, counted: Traffic, itemsize: int, world_size: int) -> float:
        """Predicted seconds of ``counted`` traffic, ``itemsize``-byte elements, over ``world_size`` ranks."""
        return (
            self.alpha * counted.messages
            + self.barrier_time(world_size) * counted.barriers
            + self.beta * counted.elements * itemsize
            + self.copy * counted.copied * itemsize
            + self.gamma * counted.reduced * itemsize
        )

    def predict(self, schedule: Schedule, itemsize: int) -> float:
        """Predicted seconds of ``schedule`` for elements of ``itemsize`` bytes."""
        return self.time(traffic(schedule), itemsize, schedule.world_size)

    def describe(self) -> str:
        """One line with the constants in readable units and their source."""
        bandwidth = f"{1e-9 / self.beta:.2f} GB/s" if self.beta > 0 else "unbounded"
        return (
            f"alpha {self.alpha * 1e6:.2f} us/message, beta {self.beta * 1e9:.4f} ns/byte ({bandwidth}), "
            f"gamma {self.gamma * 1e9:.4f} ns/byte, barrier {self.barrier * 1e6:.2f} us/peer, "
            f"copy {self.copy * 1e9:.4f} ns/byte; {self.source}"
        )


DEFAULT_MODEL = CostModel(
    alpha=6e-6, beta=0.1e-9, gamma=0.07e-9, barrier=_DEFAULT_BARRIER, copy=_DEFAULT_COPY, source="defaults"
)
"""The constants without a calibration file: 6 us, 0.1 ns/byte (10 GB/s), 0.07 ns/byte, 5 us, 0.03 ns/byte.

Measured with ``python -m bench calibrate -n 100`` under ``mpiexec -n 2`` on a
2-core Linux VM (MPICH 5.0 over shared memory, numpy 2.4 float32 sums, each case
timed by its least disturbed iteration), six runs while other jobs loaded the
cores: alpha ranged 3.6 to 13 us, beta 0.065 to 0.16 ns/byte, gamma 0.061 to 0.089
ns/byte; these are their medians, rounded. alpha is mostly the Python cost of
posting and waiting on a step's messages. The barrier measured 1.6 us per peer at
2 ranks on the quiet machine and 2 to 14 us at 2 and 4 ranks on a loaded one; 5 us
is between. The copy through shared memory measured 0.074 ns/byte by ``bench
calibrate`` (4 MiB in the executor's segments, barriers taken off), but with that
figure the model prefers ring at every size, where ``python -m bench compare``
measured the shared-memory allreduce 20-40% faster than ring from 4 MiB at 2 ranks
and as fast at 4 ranks: the exchanges beta comes from are timed warm in cache,
the collectives are not. 0.03 ns/byte makes the model's choices those measured.
``bench calibrate`` now fits beta and copy to ring and shared-memory allreduces
timed end to end on cold buffers (medians), so a calibration makes the same
choices (2 ranks: beta 0.27, copy 0.10 ns/byte). Run it on your own machine for
choices made for it.
"""


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


def _entry_order(key: str) -> float:
    return math.inf if key == _ANY_SIZE else int(key)


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
        # the keys are written by str(), so "02" or "+2" is no world size
        if key != _ANY_SIZE and not (key.isascii() and key.isdigit() and key == str(int(key)) and key != "0"):
            raise CalibrationError(
                f"{where}the key must be a world size (a positive integer) or {_ANY_SIZE!r}"
            )
        if not isinstance(entry, dict):
            raise CalibrationError(f"{where}expected a JSON object")
        size = entry.get("world_size")
        if size is not None and (key == _ANY_SIZE or not _is_world_size(size) or size != int(key)):
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


def load_model(path: Path | str | None = None, *, world_size: int) -> CostModel:
    """The cost model calibrated for ``world_size`` ranks in the file at ``path`` (:func:`calibration_path`).

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
    path = calibration_path() if path is None else Path(path)
    entries = _read_calibrations(path)
    if not entries:
        return replace(DEFAULT_MODEL, source=f"defaults (no calibration at {path})")
    if str(world_size) in entries:
        entry, source = entries[str(world_size)], f"calibrated at {world_size} ranks, from {path}"
    elif _ANY_SIZE in entries:
        entry, source = entries[_ANY_SIZE], f"calibrated for any world size, from {path}"
    else:
        # per byte, a calibration at another size on this machine is nearer the truth than the defaults
        nearest = min((int(key) for key in entries), key=lambda size: (abs(size - world_size), -size))
        entry = entries[str(nearest)]
        source = f"calibrated at {nearest} ranks, from {path} (none at {world_size})"
    defaults = {"barrier": _DEFAULT_BARRIER, "copy": _DEFAULT_COPY}
    alpha, beta, gamma, barrier, copy = (
        float(defaults[name] if entry.get(name) is None else entry[name]) for name in _CONSTANTS
    )
    return CostModel(alpha, beta, gamma, barrier, copy, source=source)


def save_model(
    model: CostModel, path: Path | str | None = None, *, world_size: int | None = None, **metadata: Any
) -> Path:
    """Keep ``model`` and JSON-ready ``metadata`` as the calibration of ``world_size`` ranks; return the path.

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
    key = _ANY_SIZE if size is None else str(size)
    path = calibration_path() if path is None else Path(path)
    entries = _read_calibrations(path) or {}
    entry: dict[str, Any] = {name: getattr(model, name) for name in _CONSTANTS}
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


def check_algorithm(collective: str, algorithm: str) -> None:
    """Raise unless ``algorithm`` is ``"auto"`` or a registered algorithm that implements ``collective``.

    Raises:
        UnknownAlgorithmError: listing the valid names, ``"auto"`` first.
    """
    if algorithm == AUTO or hasattr(algorithms.ALGORITHMS.get(algorithm), collective):
        return
    get_spec(collective)
    valid = [name for name, module in algorithms.ALGORITHMS.items() if hasattr(module, collective)]
    raise UnknownAlgorithmError(
        f"unknown algorithm {algorithm!r} for {collective}; valid algorithms are {', '.join([AUTO, *valid])}"
    )


def rejection_reasons(
    collective: str, algorithm: str, world_size: int, count: int, features: frozenset[str] = frozenset()
) -> list[str]:
    """Why a registered algorithm cannot run ``collective`` of ``count`` elements over ``world_size`` ranks.

    A module without a builder for the collective cannot, nor one whose
    ``REQUIRES`` names a transport feature not in ``features`` (e.g.
    ``"shared_memory"``); one that defines ``not_supported_reasons(collective,
    world_size, count, features)`` is asked. Empty if the algorithm applies.
    """
    module = algorithms.ALGORITHMS[algorithm]
    if not hasattr(module, collective):
        return [f"{algorithm} has no {collective}"]
    needs = getattr(module, "REQUIRES", None)
    if needs is not None and needs not in features:
        text = getattr(module, "REQUIRES_TEXT", "ranks on one node")
        return [f"needs a transport with {needs.replace('_', ' ')} ({text})"]
    ask = getattr(module, "not_supported_reasons", None)
    return [] if ask is None else list(ask(collective, world_size, count, features))


@dataclass(frozen=True)
class Candidate:
    """An algorithm the selector could run, with its prediction.

    Attributes:
        algorithm: the algorithm's name.
        schedule: the schedule's name, parameters included.
        traffic: what the model counted.
        itemsize: bytes per element.
        latency: seconds of ``alpha`` and barrier terms.
        transfer: seconds of ``beta`` terms.
        reduction: seconds of ``gamma`` terms.
    """

    algorithm: str
    schedule: str
    traffic: Traffic
    itemsize: int
    latency: float
    transfer: float
    reduction: float

    @property
    def time(self) -> float:
        """Predicted seconds in all."""
        return self.latency + self.transfer + self.reduction


@dataclass(frozen=True)
class Rejected:
    """A registered algorithm the selector ruled out, and why."""

    algorithm: str
    reasons: tuple[str, ...]


@dataclass(frozen=True)
class Explanation:
    """What the selector predicted for every algorithm, and what it chose.

    Attributes:
        collective: the collective's name.
        count: elements of the full buffer (allreduce's buffer, reduce_scatter's
            input, allgather's output).
        dtype: the element type's name.
        world_size: the number of ranks.
        op: the reduction's name; ``None`` for a collective that does not reduce.
        model: the cost model's constants.
        candidates: the algorithms that apply, fastest first.
        rejected: the algorithms that do not, with their reasons.
        choice: the fastest candidate; ``None`` when every algorithm was rejected.
        topology: the machine the transfers were predicted on, with link
            contention, instead of the model's alpha and beta; ``None`` for none.
        device: how device buffers travel, in one line (see :func:`collectives.explain`);
            ``None`` where not asked.
    """

    collective: str
    count: int
    dtype: str
    world_size: int
    op: str | None
    model: CostModel
    candidates: tuple[Candidate, ...]
    rejected: tuple[Rejected, ...]
    choice: str | None
    topology: Topology | None = None
    device: str | None = None

    def __str__(self) -> str:
        size = self.count * itemsize(self.dtype)
        op = "" if self.op is None else f", op {self.op}"
        lines = [
            f"{self.collective} of {self.count} {self.dtype} ({_bytes(size)}) over {self.world_size} "
            f"ranks{op}",
            f"cost model: {self.model.describe()}",
            *(
                []
                if self.topology is None
                else [f"transfers: on the links of {self.topology.name}, with contention, not alpha and beta"]
            ),
            *([] if self.device is None else [f"device buffers: {self.device}"]),
            "",
        ]
        titles = ("", "algorithm", "schedule", "steps", "messages", "barriers", "bytes moved",
                  "bytes copied", "bytes reduced", "latency(us)", "transfer(us)", "reduce(us)",
                  "total(us)")  # fmt: skip
        rows: list[tuple[str, ...]] = [
            ("*" if c.algorithm == self.choice else "", c.algorithm, c.schedule,
             str(c.traffic.steps), str(c.traffic.messages), str(c.traffic.barriers),
             str(c.traffic.elements * c.itemsize), str(c.traffic.copied * c.itemsize),
             str(c.traffic.reduced * c.itemsize),
             f"{c.latency * 1e6:.2f}", f"{c.transfer * 1e6:.2f}", f"{c.reduction * 1e6:.2f}",
             f"{c.time * 1e6:.2f}")
            for c in self.candidates
        ]  # fmt: skip
        lines += _table(titles, rows, left=3) if rows else ["no candidates"]
        lines.append(
            "(messages and bytes: per step, the most any one rank sends, receives, copies through "
            "shared memory or reduces)"
        )
        if self.rejected:
            lines.append("rejected:")
            width = max(len(r.algorithm) for r in self.rejected)
            lines += [f"  {r.algorithm.ljust(width)}  {'; '.join(r.reasons)}" for r in self.rejected]
        if self.choice is None:
            lines.append("choice: none")
        else:
            best = self.candidates[0]
            lines.append(f"choice: {self.choice} (predicted {best.time * 1e6:.2f} us)")
        return "\n".join(lines)


def _bytes(size: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if size >= scale:
            return f"{size / scale:.4g} {unit}"
    return f"{size} B"


def _table(titles: tuple[str, ...], rows: list[tuple[str, ...]], left: int) -> list[str]:
    """Aligned lines: the first ``left`` columns flush left, the rest flush right."""
    widths = [max(len(row[i]) for row in (titles, *rows)) for i in range(len(titles))]

    def line(cells: tuple[str, ...]) -> str:
        return "  ".join(
            cell.ljust(width) if i < left else cell.rjust(width)
            for i, (cell, width) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    return [line(titles), *(line(row) for row in rows)]


class Selector:
    """Chooses the algorithm the cost model predicts fastest, and explains the choice.

    Every algorithm in :data:`collectives.algorithms.ALGORITHMS` is a candidate
    unless it reports reasons not to be. Choices are remembered per (collective,
    world size, count, itemsize), so a repeated choice is one dict lookup; call
    :meth:`clear` after changing the registry.
    """

    def __init__(self, model: CostModel) -> None:
        self.model = model
        self._choices: dict[tuple[str, int, int, int, frozenset[str]], str] = {}

    def choose(
        self,
        collective: str,
        world_size: int,
        count: int,
        itemsize: int,
        features: frozenset[str] = frozenset(),
    ) -> str:
        """The fastest algorithm for ``collective`` of ``count`` elements of ``itemsize`` bytes.

        ``features`` are what the transport offers (e.g. ``"shared_memory"``).

        Raises:
            UnknownAlgorithmError: no registered algorithm applies; the message gives the reasons.
        """
        key = (collective, world_size, count, itemsize, features)
        choice = self._choices.get(key)
        if choice is None:
            candidates, rejected = self._rank(collective, world_size, count, itemsize, features)
            if not candidates:
                reasons = "; ".join(f"{r.algorithm}: {', '.join(r.reasons)}" for r in rejected)
                raise UnknownAlgorithmError(
                    f"no algorithm runs {collective} of {count} elements over {world_size} ranks ({reasons})"
                )
            choice = candidates[0].algorithm
            if len(self._choices) >= _CHOICES_KEPT:
                # start afresh rather than evict one by one: cheap, and safe for loopback threads
                self._choices.clear()
            self._choices[key] = choice
        return choice

    def explain(
        self,
        collective: str,
        count: int,
        dtype: object = "float32",
        *,
        world_size: int,
        op: "str | ReduceOp" = "sum",
        features: frozenset[str] = frozenset(),
        topology: Topology | None = None,
    ) -> Explanation:
        """Every algorithm's prediction for ``collective`` of ``count`` elements, and the choice.

        Args:
            collective: ``allreduce``, ``reduce_scatter`` or ``allgather``.
            count: elements of the full buffer.
            dtype: the element type, by name or as a dtype.
            world_size: the number of ranks.
            op: the reduction, checked against the dtype; ignored by collectives that do not reduce.
            features: what the transport offers, as for :meth:`choose`.
            topology: a machine with one GPU per rank: transfers are then predicted on its
                links (:func:`collectives.topology.predict`) and algorithms that know how
                build for it (multi_ring on its packed rings, hierarchical by its nodes).
        """
        name = str(getattr(dtype, "name", dtype))
        size = itemsize(name)
        reduce_op: str | None = None
        if get_spec(collective).reduces:
            get_op(op).check_dtype(name)
            reduce_op = get_op(op).name
        if world_size < 1 or count < 0:
            raise ValueError(f"need world_size >= 1 and count >= 0; got {world_size} and {count}")
        if topology is not None and len(topology.gpus) != world_size:
            raise ValueError(
                f"topology {topology.name} has {len(topology.gpus)} GPUs, not one per rank of {world_size}"
            )
        candidates, rejected = self._rank(collective, world_size, count, size, features, topology)
        choice = candidates[0].algorithm if candidates else None
        return Explanation(
            collective, count, name, world_size, reduce_op, self.model, candidates, rejected, choice, topology
        )

    def clear(self) -> None:
        """Forget remembered choices."""
        self._choices.clear()

    def _rank(
        self,
        collective: str,
        world_size: int,
        count: int,
        itemsize: int,
        features: frozenset[str],
        topology: Topology | None = None,
    ) -> tuple[tuple[Candidate, ...], tuple[Rejected, ...]]:
        """The candidates, fastest first (ties in registry order), and the rejected algorithms."""
        get_spec(collective)
        candidates: list[Candidate] = []
        rejected: list[Rejected] = []
        # across nodes a step of messages waits for those between nodes, and a barrier is a node's
        per_message, barrier_ranks = self.model.alpha, world_size
        if "shared_memory_nodes" in features:
            per_message = max(NETWORK_ALPHA, self.model.alpha)
            barrier_ranks = algorithms.hierarchical_shared_memory.ranks_per_node(features) or world_size
        for name in algorithms.ALGORITHMS:
            reasons = rejection_reasons(collective, name, world_size, count, features)
            on_links = None
            if not reasons:
                try:
                    if topology is None:
                        schedule, counted = _counted(collective, name, world_size, count, features)
                    else:
                        schedule, counted, on_links = _on_topology(
                            collective, name, world_size, count, itemsize, topology
                        )
                except TopologyError as error:
                    reasons = [f"no route on {topology.name if topology else 'the topology'}: {error}"]
                except (CollectivesError, ValueError) as error:
                    # an algorithm that cannot build this case without saying so is still no candidate
                    reasons = [f"cannot be built: {error}"]
            if reasons:
                rejected.append(Rejected(name, tuple(reasons)))
                continue
            m = self.model
            if on_links is None:
                latency = per_message * counted.messages + m.barrier_time(barrier_ranks) * counted.barriers
                transfer = m.beta * counted.elements * itemsize + m.copy * counted.copied * itemsize
            else:
                latency, transfer = on_links.latency_s, on_links.bandwidth_s
            reduction = m.gamma * counted.reduced * itemsize
            candidates.append(Candidate(name, schedule, counted, itemsize, latency, transfer, reduction))
        # sorted() is stable, so equal predictions keep the registry's order
        return tuple(sorted(candidates, key=lambda c: c.time)), tuple(rejected)


@lru_cache(maxsize=16)
def selector_for(model: CostModel) -> Selector:
    """The one selector of a cost model, so its remembered choices are shared."""
    return Selector(model)


@lru_cache(maxsize=64)
def default_selector(world_size: int) -> Selector:
    """The selector of the calibration for ``world_size`` ranks (:func:`load_model`), read once per size.

    The file is read once per process and world size; ``default_selector.cache_clear()``
    reads it again.

    Raises:
        ConfigurationError: ``world_size`` is not a positive integer.
        CalibrationError: the file is malformed.
    """
    # a selector of its own, not selector_for's: constants read at another size's entry compare equal to
    # that size's, and its model's source must still say which entry it came from and why
    return Selector(load_model(world_size=world_size))
