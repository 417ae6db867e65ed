"""A small validator of Chrome's trace event format, as Perfetto and chrome://tracing read it."""

__all__ = ["nesting_problems", "validate"]

from numbers import Real
from typing import Any

# the phases of the trace event format (duration, complete, instant, counter, async, flow, metadata ...)
PHASES = frozenset("BEXiIMCbenstfPONDRrcv(),")
_METADATA = frozenset(
    {"process_name", "process_labels", "process_sort_index", "thread_name", "thread_sort_index"}
)
_SLACK_US = 0.002  # times are written to the nanosecond


def validate(data: Any) -> list[str]:
    """What is wrong with ``data`` as a trace (the JSON object or array format); empty if nothing."""
    if isinstance(data, list):
        events = data
    elif isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
        events = data["traceEvents"]
        if data.get("displayTimeUnit", "ms") not in ("ms", "ns"):
            return [f"displayTimeUnit {data['displayTimeUnit']!r} is neither 'ms' nor 'ns'"]
    else:
        return ["neither a list of events nor an object with a traceEvents list"]
    problems = []
    for i, event in enumerate(events):
        where = f"event {i} ({event.get('name') if isinstance(event, dict) else event!r})"
        if not isinstance(event, dict):
            problems.append(f"{where}: not an object")
            continue
        ph = event.get("ph")
        if ph not in PHASES:
            problems.append(f"{where}: phase {ph!r} unknown")
            continue
        if not isinstance(event.get("name"), str):
            problems.append(f"{where}: no name")
        for key in ("pid", "tid"):
            if not isinstance(event.get(key), int | str):
                problems.append(f"{where}: {key} {event.get(key)!r} is neither an integer nor a string")
        if "args" in event and not isinstance(event["args"], dict):
            problems.append(f"{where}: args is not an object")
        if ph == "M":
            if event.get("name") not in _METADATA:
                problems.append(f"{where}: metadata {event.get('name')!r} unknown")
            continue
        if not isinstance(event.get("ts"), Real) or isinstance(event.get("ts"), bool):
            problems.append(f"{where}: ts {event.get('ts')!r} is not a number")
        if ph == "X" and (not isinstance(event.get("dur"), Real) or event["dur"] < 0):
            problems.append(f"{where}: a complete event's dur {event.get('dur')!r} is not a number >= 0")
    return problems


def nesting_problems(events: list[dict[str, Any]]) -> list[str]:
    """Complete events of one thread that overlap without one holding the other (viewers cannot stack)."""
    threads: dict[tuple[Any, Any], list[dict[str, Any]]] = {}
    for event in events:
        if event.get("ph") == "X":
            threads.setdefault((event["pid"], event["tid"]), []).append(event)
    problems = []
    for (pid, tid), found in threads.items():
        found.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict[str, Any]] = []
        for event in found:
            while stack and event["ts"] >= stack[-1]["ts"] + stack[-1]["dur"] - _SLACK_US:
                stack.pop()
            if stack and event["ts"] + event["dur"] > stack[-1]["ts"] + stack[-1]["dur"] + _SLACK_US:
                outer = stack[-1]
                problems.append(
                    f"pid {pid} tid {tid}: {event['name']} at {event['ts']} ({event['dur']} us) overlaps "
                    f"{outer['name']} at {outer['ts']} ({outer['dur']} us) without nesting in it"
                )
            stack.append(event)
    return problems
