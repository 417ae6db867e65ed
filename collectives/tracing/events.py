"""A rank's trace file: records turned into Chrome trace events, written whole after each flush.

The file is Chrome's JSON object format (``{"traceEvents": [...], ...}``), which
Perfetto (ui.perfetto.dev) and chrome://tracing open: one process (``pid``) per
rank, one thread (``tid``) per communicator, a complete event (``"ph": "X"``) per
call with its parameters in ``args``, and per step inside it at the step level.
Times are microseconds of this host's ``time.monotonic`` clock; ``otherData``
states how to align them with the other ranks' (``clock``). Events accumulate in
``rank<R>.events`` (a line each) and ``rank<R>.json`` is rewritten from it, so a
file on disk is always whole.
"""

__all__ = ["FORMAT", "SPAN", "SPAN_TID", "RankFile", "call_event", "launch_rank"]

import json
import os
import socket
import sys
import threading
import time
import traceback
from typing import Any

from ..ops import itemsize

FORMAT = "collectives-trace/1"
_LAUNCH_RANK_ENVS = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
_UNATTRIBUTED = 0  # the thread of step events outside any traced call (an executor run directly)
SPAN = "\0span"  # a record of an operation above the collectives: (SPAN, name, start, end, outcome)
SPAN_TID = 999_999  # their thread: the key-value store's operations


def launch_rank() -> int | None:
    """This process's rank as its launcher says (mpiexec of MPICH or Open MPI, PMIx), if it does."""
    for name in _LAUNCH_RANK_ENVS:
        text = os.environ.get(name, "")
        if text.isdigit():
            return int(text)
    return None


def _why(asked: str) -> str:
    """The algorithm's reason in one word: the caller named it, or the selector's model (or tuner) chose."""
    return "model" if asked == "auto" else "asked"


def call_event(
    number: int,
    signature: Any,
    algorithm: str,
    sequence: int,
    began: float,
    ended: float,
    outcome: str,
    tag: bytes,
    comm_rank: int,
) -> dict[str, Any]:
    """One call's complete event (its ``pid`` is set by the file)."""
    dtype = signature.dtype
    count = signature.count
    args: dict[str, Any] = {
        "comm": number,
        "seq": sequence,
        "rank": comm_rank,
        "count": count,
        "bytes": count * itemsize(dtype) if dtype else 0,
        "dtype": dtype,
        "algorithm": algorithm,
        "why": _why(signature.algorithm),
        "outcome": outcome,
    }
    if signature.op:
        args["op"] = signature.op
    if signature.root >= 0:
        args["root"] = signature.root
    if signature.counts is not None:
        args["counts"] = list(signature.counts)
    if tag:
        args["tag"] = tag.rstrip(b"\0").hex()
    cat = "setup" if signature.collective == "setup" else "store" if tag else "collective"
    return {
        "name": signature.collective,
        "cat": cat,
        "ph": "X",
        "ts": round(began * 1e6, 3),
        "dur": round((ended - began) * 1e6, 3),
        "tid": number,
        "args": args,
    }


class RankFile:
    """The trace files of this process in ``folder``: ``rank<R>.json``, and its dump on a timeout."""

    def __init__(self, folder: str) -> None:
        self.folder = folder
        self.rank: int | None = launch_rank()
        self.communicators: dict[int, dict[str, Any]] = {}
        self.clock: dict[int, dict[str, Any]] = {}
        self.events = 0
        self.spans = False  # whether any operation above the collectives was recorded
        self.full = 0  # flushes that found the buffer full: records may have been dropped before them
        self._steps: list[tuple[Any, ...]] = []  # step records not yet inside a call's record
        # a call's event line with its times and number left out, per communicator and signature
        self._templates: dict[tuple[Any, ...], tuple[Any, str]] = {}
        self._name: str | None = None
        self._lock = threading.Lock()

    # --- records to events

    def note_full(self) -> None:
        self.full += 1

    def add(self, records: list[tuple[Any, ...]]) -> None:
        """Turn ``records`` (oldest first) into events and append them to the rank's events file."""
        lines: list[str] = []
        steps = self._steps
        for record in records:
            if isinstance(record[0], str):
                if record[0] == SPAN:
                    lines.append(_span_line(record))
                    self.spans = True
                else:  # a step: inside the next call record that contains it
                    steps.append(record)
                continue
            tid, sequence, began, ended = self._call(record, lines)
            if steps:
                steps = _attribute(steps, tid, sequence, began, ended, lines)
        # steps no call contained by now are an executor's run outside a traced call, or a thread's
        # call still running: keep the recent ones for the next batch
        self._steps = steps[-10_000:]
        for record in steps[:-10_000]:
            lines.append(_step_line(record, _UNATTRIBUTED, None))
        if self._name is None:
            self._name = f"rank{self.rank}" if self.rank is not None else f"pid{os.getpid()}"
        self.events += len(lines)
        with open(self._path(".events"), "a") as file:
            file.writelines(lines)

    def _call(self, record: tuple[Any, ...], lines: list[str]) -> tuple[int, int, float, float]:
        """Append the call's event line; its thread, sequence number, start and end."""
        if len(record) == 5:  # a lean repeat: (its LeanAllreduce, sequence, start, end, tag)
            lean, sequence, began, ended, tag = record
            watchdog = lean.watchdog
            signature, algorithm, outcome = lean.guard.signature, lean.algorithm, "ok"
        else:
            watchdog, signature, algorithm, sequence, began, ended, outcome, tag = record
        number = watchdog.number
        key = (number, id(signature), algorithm, outcome, tag)
        kept = self._templates.get(key)
        if kept is None or kept[0] is not signature:
            comm_rank = watchdog.transport.rank
            if number not in self.communicators:
                self.communicators[number] = {"rank": comm_rank, "size": watchdog.transport.size}
                if self.rank is None:
                    self.rank = comm_rank
            if len(self._templates) > 4096:
                self._templates.clear()
            event = call_event(number, signature, algorithm, -1, 0.0, 0.0, outcome, tag, comm_rank)
            kept = self._templates[key] = (signature, _template(event))
        lines.append(kept[1] % {"ts": began * 1e6, "dur": (ended - began) * 1e6, "seq": sequence})
        return number, sequence, began, ended

    # --- files

    def _path(self, suffix: str) -> str:
        return os.path.join(self.folder, f"{self._name}{suffix}")

    def write(self) -> None:
        """Rewrite ``rank<R>.json`` whole from the events so far (a temporary file, then renamed)."""
        if self._name is None:
            return
        rank = self.rank if self.rank is not None else -1
        meta = [
            {"name": "process_name", "ph": "M", "pid": rank, "tid": 0, "args": {"name": f"rank {rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
        ]
        for number, about in sorted(self.communicators.items()):
            name = f"communicator {number} (rank {about['rank']} of {about['size']})"
            meta.append(
                {"name": "thread_name", "ph": "M", "pid": rank, "tid": number, "args": {"name": name}}
            )
        if self.spans:
            name = "key-value store operations"
            meta.append(
                {"name": "thread_name", "ph": "M", "pid": rank, "tid": SPAN_TID, "args": {"name": name}}
            )
        other = {
            "format": FORMAT,
            "rank": rank,
            "host": socket.gethostname(),
            "process": os.getpid(),
            "clock": {
                "source": "time.monotonic, microseconds",
                "epoch_minus_monotonic_us": round((time.time() - time.monotonic()) * 1e6, 3),
                "offsets": {str(n): c for n, c in sorted(self.clock.items())},
            },
            "communicators": {str(n): c for n, c in sorted(self.communicators.items())},
            "events": self.events,
            "buffer_full_at_flushes": self.full,
        }
        path = self._path(".json")
        temporary = f"{path}.{os.getpid()}.tmp"
        pid = f',"pid":{rank}}}'
        with self._lock, open(temporary, "w") as out:
            out.write('{"traceEvents":[\n')
            out.write(",\n".join(json.dumps(m, separators=(",", ":")) for m in meta))
            events = self._path(".events")
            if os.path.exists(events):
                with open(events) as lines:
                    for line in lines:
                        out.write(",\n" + line.rstrip("\n")[:-1] + pid)
            out.write('\n],"displayTimeUnit":"ns","otherData":')
            json.dump(other, out, separators=(",", ":"))
            out.write("}\n")
        os.replace(temporary, path)

    def dump(self, why: str, communicators: dict[int, Any]) -> None:
        """Write ``rank<R>.hang.json``: every communicator's flight records and every thread's stack."""
        if self._name is None:
            self._name = f"rank{self.rank}" if self.rank is not None else f"pid{os.getpid()}"
        entries = []
        for number, watchdog in sorted(communicators.items()):
            calls = []
            for entry in list(watchdog.recorder):
                s = entry.signature
                first = getattr(entry, "first", getattr(entry, "sequence", -1))
                last = getattr(entry, "last", first)
                calls.append(
                    [
                        first,
                        last,
                        s.collective,
                        s.count,
                        s.dtype,
                        s.op,
                        s.root,
                        entry.algorithm,
                        entry.outcome,
                    ]
                )
            entries.append(
                {
                    "number": number,
                    "rank": watchdog.transport.rank,
                    "size": watchdog.transport.size,
                    "calls": calls,
                }
            )
        data = {
            "format": FORMAT,
            "rank": self.rank,
            "host": socket.gethostname(),
            "process": os.getpid(),
            "why": why,
            "time": time.time(),
            "communicators": entries,
            "stacks": _stacks(),
        }
        path = self._path(".hang.json")
        with open(f"{path}.tmp", "w") as out:
            json.dump(data, out)
        os.replace(f"{path}.tmp", path)


def _template(event: dict[str, Any]) -> str:
    """``event`` as a JSON line to fill with ``%``: ``ts`` and ``dur`` (microseconds), ``seq``."""
    event = {**event, "ts": "\0ts", "dur": "\0dur", "args": {**event["args"], "seq": "\0seq"}}
    if event["cat"] == "setup":
        del event["args"]["seq"]
    text = json.dumps(event, separators=(",", ":")).replace("%", "%%")
    text = text.replace('"\\u0000ts"', "%(ts).3f").replace('"\\u0000dur"', "%(dur).3f")
    return text.replace('"\\u0000seq"', "%(seq)d") + "\n"


def _attribute(
    steps: list[tuple[Any, ...]], tid: int, sequence: int, began: float, ended: float, lines: list[str]
) -> list[tuple[Any, ...]]:
    """Put the steps within the call's time on its thread (with its number); the others stay waiting."""
    left = []
    for record in steps:
        if began <= record[1] and record[2] <= ended:
            lines.append(_step_line(record, tid, sequence))
        else:
            left.append(record)
    return left


def _span_line(record: tuple[Any, ...]) -> str:
    _, name, began, ended, outcome = record
    return (
        f'{{"name":{json.dumps(name)},"cat":"operation","ph":"X","ts":{began * 1e6:.3f},'
        f'"dur":{(ended - began) * 1e6:.3f},"tid":{SPAN_TID},"args":{{"outcome":{json.dumps(outcome)}}}}}\n'
    )


def _step_line(record: tuple[Any, ...], tid: int, sequence: int | None) -> str:
    name, began, ended, args = record
    if sequence is not None:
        args = {**args, "seq": sequence}
    event = {"name": name, "cat": "step", "ph": "X", "ts": 0, "dur": 0, "tid": tid, "args": args}
    text = json.dumps(event, separators=(",", ":")).replace('"ts":0,"dur":0', "%s")
    return text.replace("%s", f'"ts":{began * 1e6:.3f},"dur":{(ended - began) * 1e6:.3f}', 1) + "\n"


def _stacks() -> dict[str, list[str]]:
    """Every thread's Python stack, innermost last, by thread name."""
    names = {t.ident: t.name for t in threading.enumerate()}
    return {
        names.get(ident, str(ident)): [line.rstrip("\n") for line in traceback.format_stack(frame)]
        for ident, frame in sys._current_frames().items()
    }
