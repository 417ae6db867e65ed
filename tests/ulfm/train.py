"""Run under mpiexec: data-parallel training that survives a rank's death (Open MPI with ULFM).

Usage: ``python -m tests.ulfm.train STEPS CHECKPOINT_EVERY [ALGORITHM [replace]]``. Rank ``r``
starts with data shard ``r``; each step every rank sums its shards' gradients, the
ranks allreduce them, and all apply the same update. The state (step, weights, shards)
is checkpointed in memory every ``CHECKPOINT_EVERY`` steps with one copy on the next
rank. When a step raises (a rank died, or hung past the timeout), the survivors
recover: back to the last checkpoint, the lost ranks' shards taken over by the ranks
that kept their copies, and on with fewer ranks until ``STEPS``. The gradients are
integers and the step size 1/4, so every sum is exact in any order: a run that lost a
rank ends with the same weights, bit for bit, as one that did not, unless a step's
update was lost or applied twice. With ``replace`` the survivors start a new process in
each lost rank's place instead (its ``rank`` printed as ``-1 - rank``), which takes over
the lost rank's shards. Each rank prints one ``TRAINED {json}`` line.
"""

import hashlib
import json
import sys
import time
from typing import Any

import numpy as np

import collectives
from collectives.errors import BrokenCommunicatorError, CollectiveTimeout
from collectives.resilience import Checkpointer, hung_ranks, join, recover, replace

SIZE = 4096  # weights
TIMEOUT_S = 20.0


def gradient(shard: int, step: int, weights: np.ndarray) -> np.ndarray:
    """Shard ``shard``'s gradient at ``step``: integers that depend on the weights, so order matters."""
    index = np.arange(weights.size)
    return (np.floor(weights / 8) + (index * (shard + 1) + step) % 7 - 3).astype(np.float64)


def main(steps: int, every: int, algorithm: str = "ring", replacing: bool = False) -> None:
    joined = join()  # in a replacement started by a survivors' replace()
    if joined is None:
        comm = collectives.Communicator(timeout=TIMEOUT_S)
        launch = comm.rank
        checkpointer = Checkpointer(comm, replicas=1)
        state: dict[str, Any] = {"step": 0, "weights": np.zeros(SIZE), "shards": [comm.rank]}
        checkpointer.checkpoint(state)
    else:
        comm, checkpointer, launch = joined.communicator, joined.checkpointer, -1 - joined.communicator.rank
        state = joined.state()
        checkpointer.checkpoint(state)  # as the survivors do after their recovery
    recoveries: list[dict[str, Any]] = []
    began = 0.0
    failed_at: float | None = None
    recovered: dict[str, Any] = {}
    while state["step"] < steps:
        began = time.perf_counter()
        try:  # a step, and the checkpoint after it: a death in either goes back to the last checkpoint
            local = sum(gradient(s, state["step"], state["weights"]) for s in state["shards"])
            total = collectives.allreduce(local, algorithm=algorithm, comm=comm)
            state["weights"] = state["weights"] - total / 4
            state["step"] += 1
            if state["step"] % every == 0:
                checkpointer.checkpoint(state)
        except (BrokenCommunicatorError, CollectiveTimeout) as error:
            failed_at = time.perf_counter()
            recovery = recover(checkpointer, hung=hung_ranks(error))
            if replacing:  # a new process in each lost rank's place: the world size stays
                argv = [sys.executable, "-m", "tests.ulfm.train", str(steps), str(every), algorithm]
                recovery = replace(recovery, [*argv, "replace"])
            comm, checkpointer = recovery.communicator, recovery.checkpointer
            state = recovery.state()
            for lost in recovery.adopted.values():
                state["shards"] = sorted(state["shards"] + lost["shards"])
            checkpointer.checkpoint(state)  # the adopted shards get their copies on the new ring
            recovered = {
                "error": f"{type(error).__name__}: {str(error).splitlines()[0]}",
                "lost": list(recovery.lost),
                "back_to_step": state["step"],
                "detect_s": failed_at - began,
                "recover_s": time.perf_counter() - failed_at,
            }
            continue
        if failed_at is not None:  # the first step completed since the failure
            recovered["to_next_step_s"] = time.perf_counter() - failed_at
            recoveries.append(recovered)
            failed_at = None
    seen = {
        "rank": launch,
        "size": comm.size,
        "step": state["step"],
        "shards": state["shards"],
        "weights": hashlib.sha256(state["weights"].tobytes()).hexdigest(),
        "recoveries": recoveries,
    }
    print("TRAINED " + json.dumps(seen), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:4], replacing=sys.argv[4:5] == ["replace"])
