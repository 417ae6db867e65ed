"""Run under an MPI without fault tolerance (the mpich wheel's): recovering says why it cannot, once per call.

Usage: ``python -m tests.ulfm.without_ulfm``. Checkpoints still work; ``recover`` and
``shrink`` raise :class:`~collectives.ConfigurationError` naming the MPI, before any
collective, on every rank. Prints ``REFUSED {json}``.
"""

import json

import numpy as np

import collectives
from collectives.errors import ConfigurationError
from collectives.resilience import Checkpointer, fault_tolerance_missing, recover, shrink


def main() -> None:
    comm = collectives.Communicator(timeout=20.0)
    checkpointer = Checkpointer(comm)
    checkpointer.checkpoint({"x": np.arange(3) + comm.rank})
    refused = []
    for attempt in (lambda: recover(checkpointer), lambda: shrink(comm)):
        try:
            attempt()
        except ConfigurationError as error:
            refused.append(str(error))
    # the communicator is untouched: the checkpoint's copy of the previous rank is there
    held = checkpointer.replica_of((comm.rank - 1) % comm.size)["x"].tolist()
    total = collectives.allreduce(np.ones(4), comm=comm).tolist()
    print(
        "REFUSED "
        + json.dumps({"why": fault_tolerance_missing(), "refused": refused, "held": held, "sum": total})
    )


if __name__ == "__main__":
    main()
