"""Run under Open MPI's ``mpiexec --with-ft ulfm`` with ``$COLLECTIVES_FAULT``: a key-value server dies.

Usage: ``python -m tests.ulfm.store STEPS``. Every rank is a worker and a server of a
``sync`` store (SGD with momentum on the servers; a key cut into partitions on every
server, and a small key on one). Each step every worker pushes integer-valued gradients
of its launch rank and the step by ``pushpull``, then checkpoints ``{"step", "kv":
kv.state()}`` in memory (one replica, on the next rank). When a call raises, the
survivors recover (back to the last checkpoint), make a new store over their
communicator, :meth:`~collectives.kvstore.KVStore.restore` it from their own states and
the ones they adopted (the dead server's partitions from its replica), and go on from
the step after the checkpoint's. Each survivor prints ``STORE {json}``: its launch
rank, the steps each launch rank's push took part in, the final values' bytes (hex of
sha256) and whether they equal a numpy replay of the same steps.
"""

import hashlib
import json
import sys
from typing import Any

import numpy as np

import collectives
from collectives import kvstore
from collectives.errors import BrokenCommunicatorError, CollectiveTimeout, KVStoreError
from collectives.resilience import Checkpointer, hung_ranks, recover

TIMEOUT_S = 20.0
LR, MOMENTUM = 0.25, 0.5
SHAPES = {"w": (4096,), "b": (5,)}  # w: 16 KiB in 4 KiB partitions, over every server


def grad(launch_rank: int, step: int, key: str) -> np.ndarray:
    n = int(np.prod(SHAPES[key]))
    return ((np.arange(n) * (launch_rank + 1) + 3 * step + len(key)) % 7).astype(np.float32)


def replay(pushers: list[list[int]]) -> dict[str, np.ndarray]:
    """The parameters after SGD with momentum on each step's sum of its pushers' gradients."""
    params: dict[str, np.ndarray] = {}
    for key, shape in SHAPES.items():
        p, v = np.ones(shape, np.float32), None
        for step, ranks in enumerate(pushers):
            g = sum((grad(r, step, key) for r in ranks), np.zeros(shape, np.float32))
            v = np.array(g) if v is None else v * np.float32(MOMENTUM) + g
            p -= np.asarray(np.float32(LR) * v, np.float32)
        params[key] = p
    return params


def make_store(comm: collectives.Communicator) -> kvstore.KVStore:
    return kvstore.create("sync", comm=comm, timeout=TIMEOUT_S, partition_bytes=4096)


def main(steps: int) -> None:
    comm = collectives.Communicator(timeout=TIMEOUT_S)
    launch = [*range(comm.size)]
    checkpointer = Checkpointer(comm, replicas=1)
    kv = make_store(comm)
    for key, shape in SHAPES.items():
        kv.init(key, np.ones(shape, np.float32))
    kv.set_optimizer(kvstore.SGD(lr=LR, momentum=MOMENTUM))
    checkpointer.checkpoint({"step": -1, "kv": kv.state(), "pushers": []})
    pushers: list[list[int]] = []
    step, errors, values = 0, [], {}
    while step < steps:
        try:
            for key in SHAPES:
                values[key] = kv.pushpull(key, grad(launch[comm.rank], step, key))
            pushers.append(list(launch))
            checkpointer.checkpoint({"step": step, "kv": kv.state(), "pushers": pushers})
            step += 1
        except (BrokenCommunicatorError, CollectiveTimeout, KVStoreError) as error:
            errors.append(f"{type(error).__name__}: {error}")
            recovery = recover(checkpointer, hung=hung_ranks(error))
            comm, checkpointer = recovery.communicator, recovery.checkpointer
            launch = [launch[old] for old in recovery.survivors]
            state: dict[str, Any] = recovery.state()
            kv = make_store(comm)  # the old store's communicator is broken: left as it is
            kv.restore([state["kv"]] + [adopted["kv"] for adopted in recovery.adopted.values()])
            pushers = state["pushers"]
            step = state["step"] + 1
            checkpointer.checkpoint({"step": state["step"], "kv": kv.state(), "pushers": pushers})
    expected = replay(pushers)
    pulled = {key: kv.pull(key) for key in SHAPES}
    seen = {
        "rank": launch[comm.rank],
        "size": comm.size,
        "pushers": pushers,
        "errors": errors,
        "sha256": hashlib.sha256(b"".join(pulled[k].tobytes() for k in SHAPES)).hexdigest(),
        "right": all(pulled[k].tobytes() == expected[k].tobytes() for k in SHAPES),
        "last_pushpull_right": all(values[k].tobytes() == expected[k].tobytes() for k in SHAPES),
    }
    kv.close()
    print("STORE " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
