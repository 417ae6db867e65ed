"""Why a job hung, in plain words, from its ranks' dumps and traces (``python -m collectives trace why DIR``).

Each rank's record of its calls per communicator comes from its dump on a
timeout (``rank<R>.hang.json``: the flight records of every communicator and
every thread's stack; a tracing rank writes one when a call of its times out,
and the other tracing ranks when they see that) or else from its trace
(``rank<R>.json``). Per communicator, the verdict names the first call where
the ranks disagree (collective, count, dtype, op, root), the call some ranks
reached and others did not (and where each of those was instead: in another
collective, or at a line of the program), and each rank's innermost frame of the
program, ranks in one place grouped.
"""

__all__ = ["Verdict", "diagnose", "read_ranks", "verdict_text"]

import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any

from .events import FORMAT

# a call as the ranks must agree on it, and as it is shown: collective, count, dtype, op, root
Key = tuple[str, int, str, str, int]
_OK = "ok"
_LIBRARY = os.sep + "collectives" + os.sep


@dataclass
class _Calls:
    """One rank's calls on one communicator: the keys by sequence number from ``first``, their outcomes."""

    size: int
    first: int = 0
    keys: list[Key] = field(default_factory=list)
    outcomes: dict[int, str] = field(default_factory=dict)  # by sequence number, where not "ok"
    algorithms: dict[int, str] = field(default_factory=dict)  # by sequence number, the last call's only

    @property
    def last(self) -> int:
        return self.first + len(self.keys) - 1


@dataclass
class _Rank:
    rank: int
    source: str
    communicators: dict[int, _Calls] = field(default_factory=dict)
    stacks: dict[str, list[str]] = field(default_factory=dict)
    why: str = ""


@dataclass
class Verdict:
    """What ``trace why`` found, as data (:func:`verdict_text` says it in words).

    Attributes:
        ranks: the ranks read, and the kind of file each came from (``dump`` or ``trace``).
        disagreements: per communicator, the first call the ranks disagree on:
            ``(sequence, {shown call: ranks})``.
        missing: per communicator, the call some ranks did not reach:
            ``(sequence, shown call, ranks that did not, ranks that did)``.
        elsewhere: per rank that did not reach a call, the call it was in instead
            (``"allreduce #3 on communicator 2 (timed out)"``), if any.
        places: per rank, its program's innermost frame, in words.
        absent: ranks of a communicator that left neither a dump nor a trace.
    """

    ranks: dict[int, str]
    disagreements: dict[int, tuple[int, dict[str, list[int]]]] = field(default_factory=dict)
    missing: dict[int, tuple[int, str, list[int], list[int]]] = field(default_factory=dict)
    elsewhere: dict[int, str] = field(default_factory=dict)
    places: dict[int, str] = field(default_factory=dict)
    absent: list[int] = field(default_factory=list)


def _shown(key: Key) -> str:
    collective, count, dtype, op, root = key
    parts = [collective, f"count={count}"]
    if dtype:
        parts.append(dtype)
    if op:
        parts.append(op)
    if root >= 0:
        parts.append(f"root={root}")
    return " ".join(parts)


def _from_dump(data: dict[str, Any]) -> _Rank:
    communicators = data.get("communicators", [])
    rank = data.get("rank")
    if rank is None:  # no launcher said: its rank on its largest communicator
        rank = max(communicators, key=lambda c: c["size"], default={"rank": -1})["rank"]
    found = _Rank(int(rank), "dump", stacks=data.get("stacks", {}), why=data.get("why", ""))
    for about in communicators:
        calls = _Calls(int(about["size"]))
        entries = about["calls"]
        if entries:
            calls.first = entries[0][0]
        for first, last, collective, count, dtype, op, root, algorithm, outcome in entries:
            if first < calls.first + len(calls.keys):  # numbers must rise; a setup entry repeats one
                continue
            key = (collective, count, dtype, op, root)
            calls.keys.extend([key] * (last - first + 1))
            if outcome != _OK:
                calls.outcomes[last] = outcome
            calls.algorithms[last] = algorithm
        found.communicators[int(about["number"])] = calls
    return found


def _from_trace(data: dict[str, Any]) -> _Rank:
    other = data["otherData"]
    found = _Rank(int(other["rank"]), "trace")
    sizes = {int(n): c["size"] for n, c in other.get("communicators", {}).items()}
    events = [
        e for e in data["traceEvents"] if e.get("ph") == "X" and e.get("cat") in ("collective", "store")
    ]
    events.sort(key=lambda e: (e["args"]["comm"], e["args"]["seq"]))
    for event in events:
        args = event["args"]
        number = args["comm"]
        calls = found.communicators.get(number)
        if calls is None:
            calls = found.communicators[number] = _Calls(sizes.get(number, 0), first=args["seq"])
        sequence = args["seq"]
        if sequence != calls.first + len(calls.keys):
            continue  # a gap (records dropped): keep the run from the first
        calls.keys.append(
            (event["name"], args["count"], args["dtype"], args.get("op", ""), args.get("root", -1))
        )
        if args["outcome"] != _OK:
            calls.outcomes[sequence] = args["outcome"]
        calls.algorithms[sequence] = args["algorithm"]
    return found


def read_ranks(folder: str) -> list[_Rank]:
    """Every rank's calls from ``folder``: its dump where it left one, else its trace.

    Raises:
        FileNotFoundError: ``folder`` holds neither.
    """
    ranks: dict[int, _Rank] = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.hang.json"))):
        with open(path) as file:
            found = _from_dump(json.load(file))
        ranks[found.rank] = found
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        if path.endswith(".hang.json"):
            continue
        with open(path) as file:
            data = json.load(file)
        if not isinstance(data, dict) or data.get("otherData", {}).get("format") != FORMAT:
            continue
        rank = int(data["otherData"]["rank"])
        if rank not in ranks:
            ranks[rank] = _from_trace(data)
    if not ranks:
        raise FileNotFoundError(f"no dumps (rank<R>.hang.json) nor traces (rank<R>.json) in {folder}")
    return [ranks[r] for r in sorted(ranks)]


def _first_difference(lists: list[list[Key]]) -> int | None:
    """The first index where the lists (cut to the shortest) differ; ``None`` where they agree."""
    shortest = min(len(keys) for keys in lists)
    base = lists[0][:shortest]
    differing = [keys for keys in lists[1:] if keys[:shortest] != base]
    if not differing:
        return None
    return min(next(i for i in range(shortest) if keys[i] != base[i]) for keys in differing)


def diagnose(ranks: list[_Rank]) -> Verdict:
    """The verdict on the ranks' calls (see :class:`Verdict`)."""
    verdict = Verdict({r.rank: r.source for r in ranks})
    sizes = {n: c.size for r in ranks for n, c in r.communicators.items()}
    numbers = sorted(sizes)
    # the communicator of every rank (the largest, made first): a rank of it with no file is absent
    world = max(numbers, key=lambda n: (sizes[n], -n), default=None)
    if world is not None:
        known = {r.rank for r in ranks}
        verdict.absent = [r for r in range(sizes[world]) if r not in known]
    for number in numbers:
        having = [r for r in ranks if number in r.communicators]
        lists = [r.communicators[number] for r in having]
        start = max(c.first for c in lists)  # the records all ranks still hold
        cut = [c.keys[start - c.first :] for c in lists]
        differs = _first_difference(cut) if cut and all(cut) else None
        if differs is not None:
            sequence = start + differs
            shown: dict[str, list[int]] = {}
            for rank, keys in zip(having, cut, strict=True):
                shown.setdefault(_shown(keys[differs]), []).append(rank.rank)
            verdict.disagreements[number] = (sequence, shown)
        reached = max(c.last for c in lists)
        behind = [r for r, c in zip(having, lists, strict=True) if c.last < reached]
        behind_ranks = [r.rank for r in behind] + (verdict.absent if number == world else [])
        if behind_ranks:
            lowest = min((r.communicators[number].last for r in behind), default=reached - 1)
            sequence = lowest + 1
            ahead = next(c for c in lists if c.last >= sequence)
            key = ahead.keys[sequence - ahead.first]
            did = [r.rank for r, c in zip(having, lists, strict=True) if c.last >= sequence]
            verdict.missing[number] = (sequence, _shown(key), sorted(behind_ranks), did)
            for rank in behind:
                inside = _running_elsewhere(rank, number)
                if inside:
                    verdict.elsewhere[rank.rank] = inside
    for rank in ranks:
        place = _place(rank.stacks)
        if place:
            verdict.places[rank.rank] = place
    return verdict


def _running_elsewhere(rank: _Rank, number: int) -> str:
    """The call ``rank`` was in on another communicator (its last, where it did not end well)."""
    for other, calls in sorted(rank.communicators.items()):
        if other == number or not calls.keys:
            continue
        outcome = calls.outcomes.get(calls.last)
        if outcome is not None:
            return f"{_shown(calls.keys[-1])} #{calls.last} on communicator {other} ({outcome})"
    return ""


def _place(stacks: dict[str, list[str]]) -> str:
    """The main thread's innermost frame outside the library and Python's own, in words."""
    stack = stacks.get("MainThread") or next(iter(stacks.values()), [])
    for frame in reversed(stack):
        first = frame.strip().splitlines()[0] if frame.strip() else ""
        if _LIBRARY in first or "/lib/python" in first or not first.startswith("File "):
            continue
        # File "train.py", line 52, in step
        path, _, rest = first[len('File "') :].partition('", line ')
        line, _, function = rest.partition(", in ")
        code = frame.strip().splitlines()[1].strip() if len(frame.strip().splitlines()) > 1 else ""
        return f"{os.path.basename(path)}:{line} in {function}" + (f": {code}" if code else "")
    return ""


def _ranks(ranks: list[int]) -> str:
    """``ranks 0-3, 5`` (or ``rank 4``): runs of consecutive ranks shortened."""
    ordered = sorted(set(ranks))
    runs: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        runs.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return f"rank{'s' if len(ordered) > 1 else ''} {', '.join(runs)}"


def verdict_text(verdict: Verdict) -> str:
    """The verdict in plain words, a few lines however many ranks."""
    dumps = sorted(r for r, s in verdict.ranks.items() if s == "dump")
    traces = sorted(r for r, s in verdict.ranks.items() if s == "trace")
    lines = [
        f"read {len(verdict.ranks)} ranks: "
        + "; ".join(
            p for p in (dumps and f"dumps of {_ranks(dumps)}", traces and f"traces of {_ranks(traces)}") if p
        )
    ]
    if verdict.absent:
        lines.append(
            f"{_ranks(verdict.absent)} left no dump and no trace (did the process die, or not trace?)"
        )
    for number, (sequence, shown) in sorted(verdict.disagreements.items()):
        lines.append(f"communicator {number}: the ranks' calls disagree first at #{sequence}:")
        lines += [f"  {_ranks(ranks)}: {call}" for call, ranks in sorted(shown.items(), key=lambda i: i[1])]
    for number, (sequence, shown_call, behind, did) in sorted(verdict.missing.items()):
        lines.append(
            f"communicator {number}: {_ranks(behind)} did not reach {shown_call.split()[0]} #{sequence} "
            f"({shown_call}), which {_ranks(did)} reached"
        )
        for rank in behind:
            if rank in verdict.elsewhere:
                lines.append(f"  rank {rank} was in {verdict.elsewhere[rank]} instead")
    if not verdict.disagreements and not verdict.missing:
        lines.append("every rank reached the same calls, alike: no hang or mismatch in these records")
    if verdict.places:
        lines.append("where each rank's program was (innermost frame outside the library):")
        grouped: dict[str, list[int]] = {}
        for rank, place in verdict.places.items():
            grouped.setdefault(place, []).append(rank)
        lines += [
            f"  {_ranks(ranks)}: {place}" for place, ranks in sorted(grouped.items(), key=lambda i: i[1])
        ]
    return "\n".join(lines)
