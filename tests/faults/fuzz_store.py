"""Random pushes and pulls on the key-value store under mpiexec, checked against a numpy model.

Run by tests/test_fuzz_mpi.py as ``mpiexec -n P python -m tests.faults.fuzz_store SEED STEPS``.
Every rank draws the same keys (ints and strs), dtypes and sizes (cut into several
partitions) and the same sequence of ``push`` then ``pull``, ``pushpull`` and lone
``pull`` from the seed, in a ``sync`` store (collectives by default, and by messages)
and an ``async`` one. Pushed values are integer-valued, so every sum is exact in any
order: in ``sync`` every pulled value must equal the model's round aggregate bit for
bit; in ``async``, after a barrier, every key must hold its initial value plus every
worker's pushes. Rank 0 prints ``fuzz store: N steps, OK`` or the problems of every rank.
"""

import sys
import traceback
from typing import Any

import numpy as np
from mpi4py import MPI

from collectives import kvstore

DTYPES = ("float32", "float64", "int32", "int64")


def _value(rank: int, step: int, size: int, dtype: str) -> np.ndarray:
    return ((np.arange(size) * (rank + 1) + 3 * step + rank) % 11).astype(dtype)


def _run(mode: str, collective: bool, seed: int, steps: int, problems: list[str]) -> None:
    world = MPI.COMM_WORLD
    rng = np.random.default_rng(seed)
    keys: dict[Any, tuple[int, str]] = {}
    for i in range(int(rng.integers(2, 5))):
        key: Any = int(rng.integers(0, 100)) * 10 + i if rng.random() < 0.5 else f"k{i}"
        keys[key] = (int(rng.integers(1, 200)), str(rng.choice(DTYPES)))
    kv = kvstore.create(mode, timeout=20.0, partition_bytes=64, collective=collective)
    model: dict[Any, np.ndarray] = {}
    with kv:
        for key, (size, dtype) in keys.items():
            model[key] = np.arange(size).astype(dtype)
            kv.init(key, model[key])
        for step in range(steps):
            key = list(keys)[int(rng.integers(len(keys)))]
            size, dtype = keys[key]
            what = str(rng.choice(["push+pull", "pushpull", "pull"]))
            mine = _value(world.rank, step, size, dtype)
            total = sum((_value(r, step, size, dtype) for r in range(world.size)), np.zeros(size, dtype))
            if what != "pull":
                model[key] = total if mode == "sync" else model[key] + total
            if what == "push+pull":
                kv.push(key, mine)
                got = kv.pull(key)
            elif what == "pushpull":
                got = kv.pushpull(key, mine)
            else:
                got = kv.pull(key)
            if mode == "sync" and got.tobytes() != model[key].tobytes():
                problems.append(f"{mode} step {step} {what} of key {key!r}: {got} != {model[key]}")
        kv.barrier()
        for key in keys:
            got = kv.pull(key)
            if got.tobytes() != model[key].tobytes():
                problems.append(f"{mode} (collective={collective}) final key {key!r}: {got} != {model[key]}")


def main(seed: int, steps: int) -> None:
    world = MPI.COMM_WORLD
    problems: list[str] = []
    for mode, collective in (("sync", True), ("sync", False), ("async", False)):
        try:
            _run(mode, collective, seed, steps, problems)
        except Exception:
            problems.append(f"{mode} (collective={collective}): {traceback.format_exc()}")
    found = world.gather(problems, root=0)
    if world.rank == 0:
        assert found is not None
        flat = [f"rank {r}: {p}" for r, ps in enumerate(found) for p in ps]
        print(f"fuzz store: {steps} steps, " + ("OK" if not flat else f"{len(flat)} problems"), flush=True)
        for problem in flat[:20]:
            print(problem, flush=True)
    sys.exit(1 if world.allreduce(len(problems)) else 0)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
