"""A traced job under mpiexec: every call on every rank, merged on one timeline; a hang's verdict."""

import importlib.util
import os
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives
import collectives.kvstore as kvstore
from collectives.tracing.merge import merge
from collectives.tracing.why import diagnose, read_ranks
from tests.mpi.helpers import assert_all
from tests.trace_format import nesting_problems, validate

pytestmark = [
    pytest.mark.mpi,
    # one rank has no peer to merge with, wait for or miss (tests/test_tracing.py traces one process)
    pytest.mark.skipif(MPI.COMM_WORLD.Get_size() < 2, reason="a traced job's checks need 2 or more ranks"),
]


def _folder(world: MPI.Intracomm) -> str:
    return str(world.bcast(tempfile.mkdtemp(prefix="collectives-trace-") if world.rank == 0 else None))


def _job(comm: collectives.Communicator) -> None:
    """Calls of each kind: lean repeats, a large ring allreduce, rooted, persistent, the store."""
    x = np.arange(256, dtype=np.float32)
    for _ in range(5):
        collectives.allreduce(x, out=x, comm=comm)
    collectives.allreduce(np.ones(300_000, np.float32), comm=comm, algorithm="ring")
    collectives.broadcast(x, root=comm.size - 1, comm=comm)
    collectives.allgather(x, comm=comm)
    collectives.barrier(comm=comm)
    persistent = collectives.allreduce_init(x, out=x, comm=comm)
    for _ in range(3):
        persistent()
    store = kvstore.create("sync", comm=comm)
    store.init("w", np.zeros(16))
    for _ in range(2):
        store.push("w", np.ones(16))
        store.pull("w")
    store.close()


def _problems(folder: str, size: int) -> list[str]:
    """What is wrong with the ranks' merged trace, checked on rank 0."""
    merged = merge(folder, predict=True)
    problems = validate(merged) + nesting_problems(merged["traceEvents"])
    events = merged["traceEvents"]
    calls: dict[int, dict[tuple[int, int], dict[str, object]]] = {}
    for event in events:
        if event.get("cat") in ("collective", "store"):
            calls.setdefault(event["pid"], {})[(event["args"]["comm"], event["args"]["seq"])] = event
    if sorted(calls) != list(range(size)):
        return [*problems, f"calls of ranks {sorted(calls)}, not of 0..{size - 1}"]
    keys = set(calls[0])
    for rank, mine in calls.items():
        if set(mine) != keys:
            problems.append(f"rank {rank}'s calls differ from rank 0's: {sorted(set(mine) ^ keys)[:5]}")
            continue
        for key, event in mine.items():
            theirs = calls[0][key]
            if (event["name"], event["args"]["count"]) != (theirs["name"], theirs["args"]["count"]):
                problems.append(f"rank {rank}'s call {key} is {event['name']}, rank 0's {theirs['name']}")
    for number in {n for n, _ in keys}:
        numbers = sorted(s for n, s in keys if n == number)
        if numbers != list(range(len(numbers))):
            problems.append(f"communicator {number}'s sequence numbers have gaps: {numbers}")
    if not any(e.get("cat") == "store" for e in events):
        problems.append("no call of the store")
    # the step events lie inside their call, and the ring allreduce has its two steps on every rank
    steps = [e for e in events if e.get("cat") == "step" and "seq" in e.get("args", {})]
    for step in steps:
        call = calls[step["pid"]].get((step["tid"], step["args"]["seq"]))
        if call is None or not call["ts"] - 0.002 <= step["ts"] <= step["ts"] + step["dur"] <= (
            call["ts"] + call["dur"] + 0.002
        ):
            problems.append(f"step {step['name']} of rank {step['pid']} is not inside its call")
    for rank in range(size):
        ring = [e for e in calls[rank].values() if e["args"]["algorithm"] == "ring"]
        named = {
            e["name"]
            for e in steps
            if e["pid"] == rank and ring and e["args"]["seq"] == ring[0]["args"]["seq"]
        }
        if not {"step 0", "step 1"} <= named:
            problems.append(f"rank {rank}: the ring allreduce's steps are missing: {sorted(named)}")
    if not any(e.get("cat") == "predicted" for e in events):
        problems.append("no predicted track")
    return problems


def test_a_traced_job_merges_with_every_call_on_every_rank(world: MPI.Intracomm) -> None:
    folder = _folder(world)
    with collectives.trace(folder, steps=True):
        comm = collectives.Communicator(world)
        _job(comm)
        comm.free()
    world.Barrier()
    problems = _problems(folder, world.size) if world.rank == 0 else []
    assert_all(not problems, "; ".join(problems[:10]))


def test_trace_why_names_the_rank_that_did_not_come(world: MPI.Intracomm) -> None:
    folder = _folder(world)
    late = world.size - 1
    with collectives.trace(folder):
        comm = collectives.Communicator(world, timeout=2.0)
        x = np.ones(8, np.float32)
        collectives.allreduce(x, comm=comm)
        if world.rank != late:
            with pytest.raises(collectives.CollectiveTimeout):
                collectives.allreduce(x, comm=comm)
        else:
            time.sleep(4.0)  # elsewhere: its writer answers the others' dump with its own
    world.Barrier()
    comm.free()
    problems = []
    if world.rank == 0:
        dumps = sorted(p for p in os.listdir(folder) if p.endswith(".hang.json"))
        verdict = diagnose(read_ranks(folder))
        number = max(verdict.missing, default=-1)
        found = verdict.missing.get(number)
        if found is None or found[0] != 1 or found[2] != [late]:
            problems.append(f"the verdict missed rank {late} at call #1: {verdict.missing}")
        if "time.sleep(4.0)" not in verdict.places.get(late, ""):
            problems.append(f"rank {late}'s place is not its sleep: {verdict.places}, dumps {dumps}")
    assert_all(not problems, "; ".join(problems))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="the torch backend's ranges need torch")
def test_the_torch_backends_calls_are_profiler_ranges(world: MPI.Intracomm, group: int) -> None:
    import torch
    import torch.distributed as dist

    tensor = torch.ones(1024)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        dist.all_reduce(tensor)
        dist.broadcast(tensor, src=0)
    names = {event.name for event in profile.events()}
    missing = {"collectives.allreduce", "collectives.broadcast"} - names
    assert_all(not missing and float(tensor[0]) == world.size, f"ranges missing: {missing}")
