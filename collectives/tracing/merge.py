"""Every rank's trace file on one timeline (``python -m collectives trace merge DIR -o job.json``).

Each rank's events move onto rank 0's clock by the offset its file states (the
pings as its communicator was made, :mod:`collectives.tracing.clock`); a rank
whose file states none is placed by its calls instead: a call that synchronises
the ranks (an allreduce, all-gather, reduce-scatter, all-to-all or barrier)
cannot end on one rank before it began on another, which bounds the offset from
both sides (the middle of the bounds is taken). The merged file says which way
each rank was placed. A call matched across ranks (the same communicator and
sequence number) gets ``last`` (the rank that began it last) and ``waited_us``
(how long this rank waited for it). With ``predict``, each rank gets a track per
communicator with what the cost model says each call and step should have taken
(:mod:`collectives.tracing.predicted`), beside the measured ones.
"""

__all__ = ["MERGED_FORMAT", "SYNCHRONISING", "TraceFile", "merge", "read_traces"]

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .events import FORMAT
from .predicted import predict_call

MERGED_FORMAT = "collectives-trace-merged/1"
SYNCHRONISING = frozenset({"allreduce", "allgather", "reduce_scatter", "alltoall", "barrier"})
_LANE = 10_000  # between the tids of a predicted track's lanes (more than a rank's communicators)
_PREDICTED_TID = 1_000_000  # a predicted track's thread: this plus the communicator's number


@dataclass
class TraceFile:
    """One rank's trace file, read.

    Attributes:
        path: where it was read from.
        rank: the rank it is of.
        events: its events (metadata included), as written.
        other: its ``otherData``.
        offset_us: its clock minus rank 0's, once known; ``None`` before.
        placed: how the offset was found: ``pings``, ``calls``, ``reference`` or ``none``.
    """

    path: str
    rank: int
    events: list[dict[str, Any]]
    other: dict[str, Any]
    offset_us: float | None = None
    placed: str = "none"
    round_trip_us: float | None = None
    calls: dict[tuple[int, int], dict[str, Any]] = field(default_factory=dict)


def read_traces(folder: str) -> list[TraceFile]:
    """The rank trace files in ``folder`` (``rank<R>.json`` as written by the tracer), by rank.

    Raises:
        FileNotFoundError: ``folder`` holds none.
        ValueError: a file is not a collectives trace, or two files are of one rank.
    """
    files = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        if path.endswith(".hang.json"):
            continue
        with open(path) as file:
            data = json.load(file)
        other = data.get("otherData", {}) if isinstance(data, dict) else {}
        if other.get("format") != FORMAT:
            continue  # a merged file, or another tool's
        files.append(TraceFile(path, int(other["rank"]), data["traceEvents"], other))
    if not files:
        raise FileNotFoundError(f"no rank trace files (rank<R>.json with {FORMAT!r}) in {folder}")
    ranks = [f.rank for f in files]
    twice = sorted({r for r in ranks if ranks.count(r) > 1})
    if twice:
        raise ValueError(f"{folder} holds two trace files of rank(s) {twice}: one run's files only, please")
    return sorted(files, key=lambda f: f.rank)


def _index_calls(trace: TraceFile) -> None:
    trace.calls = {
        (e["args"]["comm"], e["args"]["seq"]): e
        for e in trace.events
        if e.get("ph") == "X" and e.get("cat") in ("collective", "store")
    }


def _world(trace: TraceFile) -> str | None:
    """The communicator of the rank's file with the most ranks whose clock comparison worked."""
    offsets = trace.other.get("clock", {}).get("offsets", {})
    sizes = trace.other.get("communicators", {})
    usable = [n for n, o in offsets.items() if o.get("offset_us") is not None]
    return max(usable, key=lambda n: (sizes.get(n, {}).get("size", 0), -int(n)), default=None)


def _place(traces: list[TraceFile]) -> None:
    """Every rank's offset to rank 0's clock: stated by its pings, else bounded by its calls."""
    reference = traces[0]
    for trace in traces:
        number = _world(trace)
        if number is not None:
            stated = trace.other["clock"]["offsets"][number]
            trace.offset_us = float(stated["offset_us"])
            trace.round_trip_us = stated.get("round_trip_us")
            trace.placed = "reference" if stated.get("reference") else "pings"
        elif trace is reference:
            trace.offset_us, trace.placed = 0.0, "reference"
    for trace in traces:
        if trace.offset_us is None:
            bounds = _bounds(trace, reference)
            if bounds is None:
                trace.offset_us, trace.placed = 0.0, "none"
            else:
                trace.offset_us, trace.placed = (bounds[0] + bounds[1]) / 2, "calls"


def _bounds(trace: TraceFile, reference: TraceFile) -> tuple[float, float] | None:
    """The offset's bounds from the calls that synchronise both ranks (microseconds, on each one's clock)."""
    low, high = -float("inf"), float("inf")
    base = reference.offset_us or 0.0
    for key, event in trace.calls.items():
        theirs = reference.calls.get(key)
        if theirs is None or event["name"] not in SYNCHRONISING or event["args"].get("outcome") != "ok":
            continue
        start0, end0 = theirs["ts"] - base, theirs["ts"] + theirs["dur"] - base
        low = max(low, event["ts"] - end0)
        high = min(high, event["ts"] + event["dur"] - start0)
    if low == -float("inf") or low > high:
        return None
    return low, high


def _waits(traces: list[TraceFile]) -> None:
    """Per call matched across ranks (shifted already): who began last, and how long each waited for it."""
    starts: dict[tuple[int, int], list[tuple[float, int]]] = {}
    for trace in traces:
        for key, event in trace.calls.items():
            starts.setdefault(key, []).append((event["ts"], trace.rank))
    for trace in traces:
        for key, event in trace.calls.items():
            found = starts[key]
            if len(found) > 1:
                latest, last = max(found)
                event["args"]["last"] = last
                event["args"]["waited_us"] = round(max(latest - event["ts"], 0.0), 3)


def _predicted(trace: TraceFile) -> list[dict[str, Any]]:
    """The rank's predicted track: per call, the model's time and steps, from the call's start."""
    events: list[dict[str, Any]] = []
    sizes = {int(n): c["size"] for n, c in trace.other.get("communicators", {}).items()}
    measured_steps: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for event in trace.events:
        if event.get("cat") == "step" and event["name"].startswith("step ") and "seq" in event["args"]:
            measured_steps.setdefault((event["tid"], event["args"]["seq"]), []).append(event)
    lanes: dict[int, list[float]] = {}  # per communicator, where each lane's last prediction ends
    for (number, sequence), call in trace.calls.items():
        args = call["args"]
        if call.get("cat") == "setup" or number not in sizes:
            continue
        predicted = predict_call(
            call["name"], args["algorithm"], sizes[number], args["count"], args["dtype"],
            args.get("op", ""), args.get("root", 0),
        )  # fmt: skip
        ends = lanes.setdefault(number, [])
        if not predicted.total:
            args["predicted"] = predicted.why
            continue
        total_us = predicted.total * 1e6
        # a call faster than its prediction ends before the prediction does: the next call's goes on
        # another lane of the track, so no prediction overlaps another without nesting in it
        lane = next((i for i, end in enumerate(ends) if end <= call["ts"]), len(ends))
        if lane == len(ends):
            ends.append(0.0)
        ends[lane] = call["ts"] + total_us
        tid = _PREDICTED_TID + number + _LANE * lane
        args["predicted_us"] = round(total_us, 3)
        args["measured_over_predicted"] = round(call["dur"] / total_us, 3) if total_us else None
        events.append(
            {
                "name": f"{call['name']} (model)", "cat": "predicted", "ph": "X", "ts": call["ts"],
                "dur": round(total_us, 3), "pid": trace.rank, "tid": tid,
                "args": {"seq": sequence, "schedule": predicted.schedule, "scale": predicted.scale,
                         "measured_us": call["dur"]},
            }
        )  # fmt: skip
        measured = {int(e["name"].split()[1]): e for e in measured_steps.get((number, sequence), [])}
        at = call["ts"] + predicted.overhead * 1e6
        for index, seconds in enumerate(predicted.steps):
            step_args: dict[str, Any] = {"seq": sequence, "predicted_us": round(seconds * 1e6, 3)}
            if index in measured and seconds > 0:
                step_args["measured_us"] = measured[index]["dur"]
                step_args["measured_over_predicted"] = round(measured[index]["dur"] / (seconds * 1e6), 3)
            events.append(
                {
                    "name": f"step {index} (model)", "cat": "predicted", "ph": "X", "ts": round(at, 3),
                    "dur": round(seconds * 1e6, 3), "pid": trace.rank, "tid": tid, "args": step_args,
                }
            )  # fmt: skip
            at += seconds * 1e6
    for number, ends in sorted(lanes.items()):
        for lane in range(max(len(ends), 1)):
            name = f"communicator {number}: cost model" + (f" ({lane + 1})" if lane else "")
            tid = _PREDICTED_TID + number + _LANE * lane
            events.append(
                {"name": "thread_name", "ph": "M", "pid": trace.rank, "tid": tid, "args": {"name": name}}
            )
    return events


def merge(folder: str, *, predict: bool = False) -> dict[str, Any]:
    """The ranks' trace files in ``folder`` as one Chrome trace: one process per rank on rank 0's clock.

    Raises:
        FileNotFoundError: ``folder`` holds no rank trace file.
        ValueError: as :func:`read_traces`.
    """
    traces = read_traces(folder)
    for trace in traces:
        _index_calls(trace)
    _place(traces)
    events: list[dict[str, Any]] = []
    for trace in traces:
        shift = trace.offset_us or 0.0
        for event in trace.events:
            event["pid"] = trace.rank
            if "ts" in event and shift:
                event["ts"] = round(event["ts"] - shift, 3)
    _waits(traces)
    for trace in traces:
        events.extend(trace.events)
        if predict:
            events.extend(_predicted(trace))
    clock = {
        str(t.rank): {"offset_us": t.offset_us, "placed_by": t.placed, "round_trip_us": t.round_trip_us}
        for t in traces
    }
    return {
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "format": MERGED_FORMAT,
            "ranks": [t.rank for t in traces],
            "clock": clock,
            "clock_note": "each rank's times moved onto rank 0's clock: minus its offset_us; placed_by "
            "'pings' (measured as the communicator was made, good to half round_trip_us), 'calls' "
            "(bounded by calls that synchronise the ranks), 'reference' (rank 0) or 'none'",
            "files": [os.path.basename(t.path) for t in traces],
            "predicted": predict,
        },
    }
