"""Run under mpiexec: a damaged or crafted checkpoint file raises on every rank, naming the file.

Usage: ``python -m tests.faults.damaged_checkpoint DIRECTORY flip``: the ranks save, rank 1's
file gets a flipped bit, every rank loads. ``... DIRECTORY pickle``: an old-format checkpoint
whose rank-1 file is a pickle that makes a marker folder when unpickled; every rank loads. Rank 0
prints ``OK`` if every rank raised naming the file (and the marker was never made).
"""

import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

import collectives
from collectives.errors import CheckpointError
from collectives.resilience import folder_of, load, save
from collectives.resilience.serial import pieces


class _Marker:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (os.makedirs, (str(self.path),))


def _crafted(comm: collectives.Communicator, directory: Path) -> Path:
    folder = folder_of(directory, 1)
    if comm.rank == 0:
        folder.mkdir(parents=True)
        for rank in range(comm.size):
            state = (
                {"w": np.ones(3), "evil": _Marker(directory / "pwned")} if rank == 1 else {"w": np.ones(3)}
            )
            (folder / f"rank-{rank}.pkl").write_bytes(b"".join(bytes(p) for p in pieces(state)))
        manifest = {"format": "collectives.resilience/1", "size": comm.size, "version": 1}
        (folder / "manifest.json").write_text(json.dumps(manifest))
    return folder / "rank-1.pkl"


def _flipped(comm: collectives.Communicator, directory: Path) -> Path:
    save(directory, {"w": np.arange(1000.0) + comm.rank}, 1, comm=comm)
    path = folder_of(directory, 1) / "rank-1.state"
    if comm.rank == 1:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x10
        path.write_bytes(bytes(data))
    return path


def main(directory: Path, how: str) -> None:
    comm = collectives.Communicator(timeout=20)
    path = (_crafted if how == "pickle" else _flipped)(comm, directory)
    collectives.barrier(comm=comm)
    try:
        load(directory, comm=comm)
        good = False
    except CheckpointError as error:
        good = str(path) in str(error)
    good = good and not (directory / "pwned").exists()
    verdict = collectives.allreduce(np.array([int(good)], np.int32), op="min", comm=comm)
    if comm.rank == 0:
        print("OK" if verdict[0] == 1 else "WRONG", flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
