"""Run under mpiexec: a checkpoint damaged on one rank's file raises on every rank, naming that file.

Usage: ``python -m tests.faults.damaged_checkpoint DIRECTORY``: the ranks save, rank 1's file
gets a flipped bit, every rank loads; rank 0 prints ``OK`` if all raised naming the file.
"""

import sys
from pathlib import Path

import numpy as np

import collectives
from collectives.errors import CheckpointError
from collectives.resilience import folder_of, load, save


def main(directory: Path) -> None:
    comm = collectives.Communicator(timeout=20)
    save(directory, {"w": np.arange(1000.0) + comm.rank}, 1, comm=comm)
    path = folder_of(directory, 1) / "rank-1.state"
    if comm.rank == 1:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    collectives.barrier(comm=comm)
    try:
        load(directory, comm=comm)
        good = False
    except CheckpointError as error:
        good = str(path) in str(error)
    verdict = collectives.allreduce(np.array([int(good)], np.int32), op="min", comm=comm)
    if comm.rank == 0:
        print("OK" if verdict[0] == 1 else "WRONG", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
