"""Traces without MPI: hang verdicts on synthetic dumps, predicted times, merging, the files' format."""

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import collectives
from collectives.algorithms import ALGORITHMS, build_schedule
from collectives.algorithms.base import implements, required_feature
from collectives.bench.trace_why import right, write_dumps
from collectives.selector import default_selector
from collectives.specs import COLLECTIVES
from collectives.tracing import TRACER
from collectives.tracing.cli import main as trace_main
from collectives.tracing.events import FORMAT
from collectives.tracing.merge import merge
from collectives.tracing.predicted import predict_call
from collectives.tracing.why import diagnose, read_ranks, verdict_text
from collectives.transport.loopback import LoopbackWorld
from tests.mpirun import mpiexec, run_mpi
from tests.trace_format import nesting_problems, validate

_STEP = '  File "/job/train.py", line 52, in step\n    collectives.allreduce(grads)\n'


def _dump(folder: Path, rank: int, communicators: list[dict[str, Any]], stack: str = _STEP) -> None:
    data = {"format": FORMAT, "rank": rank, "why": "test", "communicators": communicators,
            "stacks": {"MainThread": [stack]}}  # fmt: skip
    (folder / f"rank{rank}.hang.json").write_text(json.dumps(data))


def _calls(
    first: int, last: int, count: int = 100, name: str = "allreduce", end: str = "ok"
) -> list[list[Any]]:
    calls: list[list[Any]] = [
        [s, s, name, count, "float32", "sum", -1, "ring", "ok"] for s in range(first, last + 1)
    ]
    calls[-1][-1] = end
    return calls


def test_why_names_the_rank_that_skipped_a_call(tmp_path: Path) -> None:
    write_dumps(str(tmp_path), ranks=8, calls=1000, late=5, skipped=321)
    verdict = diagnose(read_ranks(str(tmp_path)))
    assert right(verdict, 5, 321)
    assert verdict.missing[1][:3] == (999, "allreduce count=1029 float32 sum", [5])
    text = verdict_text(verdict)
    assert "disagree first at #321" in text and "rank 5: allreduce" in text
    assert "rank 5: train.py:88 in load_batch" in text


def test_why_names_a_rank_that_did_not_reach_a_call(tmp_path: Path) -> None:
    for rank in range(4):
        last = 6 if rank == 2 else 7
        _dump(
            tmp_path,
            rank,
            [
                {
                    "number": 1,
                    "rank": rank,
                    "size": 4,
                    "calls": _calls(0, last, end="timed out" if rank != 2 else "ok"),
                }
            ],
        )
    verdict = diagnose(read_ranks(str(tmp_path)))
    assert verdict.disagreements == {}
    assert verdict.missing[1] == (7, "allreduce count=100 float32 sum", [2], [0, 1, 3])
    assert "communicator 1: rank 2 did not reach allreduce #7" in verdict_text(verdict)


def test_why_names_a_mismatched_size(tmp_path: Path) -> None:
    for rank in range(3):
        calls = _calls(0, 9)
        if rank == 1:
            calls[5][3] = 200
        _dump(tmp_path, rank, [{"number": 1, "rank": rank, "size": 3, "calls": calls}])
    verdict = diagnose(read_ranks(str(tmp_path)))
    sequence, shown = verdict.disagreements[1]
    assert sequence == 5
    assert shown == {"allreduce count=100 float32 sum": [0, 2], "allreduce count=200 float32 sum": [1]}


def test_why_names_a_rank_stuck_in_another_collective(tmp_path: Path) -> None:
    for rank in range(3):
        world = {
            "number": 1,
            "rank": rank,
            "size": 3,
            "calls": _calls(0, 6 if rank == 2 else 7, end="ok" if rank == 2 else "timed out"),
        }
        other = {"number": 2, "rank": rank, "size": 3,
                 "calls": _calls(0, 3, name="broadcast", end="timed out" if rank == 2 else "ok")}  # fmt: skip
        _dump(tmp_path, rank, [world, other])
    verdict = diagnose(read_ranks(str(tmp_path)))
    assert verdict.missing[1][2] == [2]
    assert verdict.elsewhere[2] == "broadcast count=100 float32 sum #3 on communicator 2 (timed out)"
    assert "rank 2 was in broadcast count=100 float32 sum #3 on communicator 2" in verdict_text(verdict)


def test_why_names_an_absent_rank(tmp_path: Path) -> None:
    for rank in (0, 1, 3):
        _dump(
            tmp_path, rank, [{"number": 1, "rank": rank, "size": 4, "calls": _calls(0, 4, end="timed out")}]
        )
    verdict = diagnose(read_ranks(str(tmp_path)))
    assert verdict.absent == [2]
    assert verdict.missing[1][2] == [2]
    assert "rank 2 left no dump and no trace" in verdict_text(verdict)


def test_why_reads_traces_where_no_rank_dumped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for rank in range(2):
        events = [
            {"name": "allreduce", "cat": "collective", "ph": "X", "ts": float(s), "dur": 1.0,
             "pid": rank, "tid": 1,
             "args": {"comm": 1, "seq": s, "count": 8, "dtype": "float32", "op": "sum", "algorithm": "ring",
                      "outcome": "ok"}}
            for s in range(5 if rank == 0 else 4)
        ]  # fmt: skip
        other = {"format": FORMAT, "rank": rank, "communicators": {"1": {"rank": rank, "size": 2}}}
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({"traceEvents": events, "otherData": other}))
    assert trace_main(["why", str(tmp_path)]) == 0
    assert "rank 1 did not reach allreduce #4" in capsys.readouterr().out


def test_why_says_when_there_is_nothing_to_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trace_main(["why", str(tmp_path)]) == 1
    assert "no dumps" in capsys.readouterr().err


def _cases() -> list[tuple[str, str]]:
    return [(c, a) for a, module in ALGORITHMS.items() for c in COLLECTIVES if implements(module, c)]


@pytest.mark.parametrize(("collective", "algorithm"), _cases())
def test_every_algorithm_has_a_predicted_track_from_explains_model(collective: str, algorithm: str) -> None:
    size, count = 4, 0 if collective == "barrier" else 4096
    needs = required_feature(ALGORITHMS[algorithm])
    if needs == "shared_memory_nodes":
        pytest.skip("needs a node split, which a trace's communicator sizes do not say")  # stated in docs
    predicted = predict_call(collective, algorithm, size, count, "float32", "sum")
    assert predicted.why == ""
    features = frozenset() if needs is None else frozenset({needs})
    explained = default_selector(size).explain(
        collective, count, "float32", world_size=size, features=features
    )
    candidate = next(c for c in explained.candidates if c.algorithm == algorithm)
    assert predicted.total == candidate.time  # the figure explain prints
    assert len(predicted.steps) == len(build_schedule(collective, algorithm, size, count).steps)
    assert predicted.overhead + sum(predicted.steps) == pytest.approx(predicted.total)


def _rank_file(folder: Path, rank: int, shift: float, offset: float | None) -> None:
    events = [
        {"name": "allreduce", "cat": "collective", "ph": "X",
         "ts": 100.0 * s + shift + (5.0 if rank else 0.0),
         "dur": 20.0 - (5.0 if rank else 0.0), "tid": 1, "pid": rank,
         "args": {"comm": 1, "seq": s, "count": 1024, "dtype": "float32", "op": "sum",
                  "algorithm": "ring", "outcome": "ok"}}
        for s in range(10)
    ]  # fmt: skip
    offsets = {} if offset is None else {"1": {"offset_us": offset, "round_trip_us": 2.0, "rounds": 8}}
    other = {"format": FORMAT, "rank": rank, "clock": {"offsets": offsets},
             "communicators": {"1": {"rank": rank, "size": 2}}}  # fmt: skip
    (folder / f"rank{rank}.json").write_text(json.dumps({"traceEvents": events, "otherData": other}))


@pytest.mark.parametrize("stated", [True, False])
def test_merge_puts_the_ranks_on_rank_0s_clock(tmp_path: Path, stated: bool) -> None:
    _rank_file(tmp_path, 0, 0.0, 0.0 if stated else None)
    _rank_file(tmp_path, 1, 1000.0, 1000.0 if stated else None)  # its clock is 1 ms ahead
    merged = merge(str(tmp_path), predict=True)
    assert validate(merged) == [] and nesting_problems(merged["traceEvents"]) == []
    clock = merged["otherData"]["clock"]["1"]
    assert clock["placed_by"] == ("pings" if stated else "calls")
    assert clock["offset_us"] == pytest.approx(1000.0, abs=0.0 if stated else 20.0)
    calls = [e for e in merged["traceEvents"] if e.get("cat") == "collective"]
    late = [e for e in calls if e["pid"] == 0]
    assert all(e["args"]["last"] == 1 for e in calls)
    if stated:
        assert all(e["args"]["waited_us"] == 5.0 for e in late)
    predicted = [e for e in merged["traceEvents"] if e.get("cat") == "predicted" and "(model)" in e["name"]]
    assert {e["pid"] for e in predicted} == {0, 1}
    assert all(e["args"]["predicted_us"] > 0 for e in calls)


def test_the_validator_finds_bad_events() -> None:
    good = {"name": "a", "ph": "X", "ts": 0.0, "dur": 10.0, "pid": 0, "tid": 1}
    assert validate({"traceEvents": [good]}) == []
    assert validate({"traceEvents": [{**good, "ph": "Q"}]}) != []
    assert validate({"traceEvents": [{**good, "dur": -1}]}) != []
    assert validate({"events": []}) != []
    assert nesting_problems([good, {**good, "ts": 5.0, "dur": 10.0}]) != []
    assert nesting_problems([good, {**good, "ts": 5.0, "dur": 5.0}]) == []


def test_a_traced_loopback_job_writes_valid_nested_events(tmp_path: Path) -> None:
    network = LoopbackWorld(2)
    failures: list[BaseException] = []

    def rank(r: int) -> None:
        try:
            comm = collectives.Communicator(network.transport(r))
            x = np.arange(64, dtype=np.float32)
            for algorithm in ("ring", "tree", "auto"):
                collectives.allreduce(x, comm=comm, algorithm=algorithm)
            collectives.broadcast(x, root=1, comm=comm)
        except BaseException as error:
            failures.append(error)

    with collectives.trace(tmp_path, steps=True):
        threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert not failures and not TRACER.on
    (written,) = [p for p in os.listdir(tmp_path) if p.endswith(".json")]
    data = json.loads((tmp_path / written).read_text())
    assert validate(data) == [] and nesting_problems(data["traceEvents"]) == []
    calls = [e for e in data["traceEvents"] if e.get("cat") == "collective"]
    assert sorted(e["args"]["seq"] for e in calls) == [0, 0, 1, 1, 2, 2, 3, 3]
    steps = [e for e in data["traceEvents"] if e.get("cat") == "step" and e["name"].startswith("step ")]
    assert steps and all("seq" in e["args"] for e in steps)


@pytest.mark.skipif(mpiexec() is None, reason="no mpiexec: install the mpich extra")
def test_the_tracing_cost_bench_times_every_mode() -> None:
    args = [
        "-m",
        "collectives",
        "bench",
        "trace_cost",
        "-n",
        "20",
        "-r",
        "2",
        "--size",
        "64K",
        "--algorithm",
        "ring",
        "--steps",
    ]
    result = run_mpi(2, args, timeout=120)
    assert result.returncode == 0, result.stdout
    rows = re.findall(r"^(\w+) +([\w+]+) +(\d+\.\d+) us +(\d+\.\d+)x off$", result.stdout, re.MULTILINE)
    modes = ["off", "calls", "calls+write", "steps", "steps+write"]
    assert [(name, mode) for name, mode, _, _ in rows] == [
        (n, m) for n in ("allreduce", "persistent") for m in modes
    ]
    assert all(float(us) > 0 for _, _, us, _ in rows), result.stdout
