"""new_group under the env:// and file:// init methods, as the first group and later; run under mpiexec.

Every rank creates every group, as torch asks; the groups of one rank leave the others out. Each
rank prints one line ``RESULT {json}`` with the problems it found (none when all went well); the
test reads them.

Usage: ``mpiexec -n 2 python -m tests.torch_init_methods METHOD`` with METHOD ``env`` or ``file``.
"""

import json
import os
import socket
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from mpi4py import MPI

import collectives.torch_integration  # noqa: F401 - registers the backend

WORLD = MPI.COMM_WORLD
TIMEOUT = timedelta(seconds=20)  # a rank left waiting errs in this, rather than hang the run


def _init_method(method: str) -> str:
    """The URL of ``method`` (``env`` or ``file``) that rank 0 picks, told to every rank by MPI."""
    if method == "env":
        port = 0
        if WORLD.rank == 0:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = probe.getsockname()[1]
        port = WORLD.bcast(port)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        os.environ.update(RANK=str(WORLD.rank), WORLD_SIZE=str(WORLD.size))
        return "env://"
    path = WORLD.bcast(os.path.join(tempfile.mkdtemp(), "rendezvous") if WORLD.rank == 0 else None)
    return f"file://{path}"


def _summed(ranks: list[int], group: dist.ProcessGroup | None, problems: list[str], label: str) -> None:
    """All-reduce each rank's number in ``group`` (of ``ranks``); a member checks it got their sum."""
    if WORLD.rank not in ranks:
        return
    total = torch.full((3,), float(WORLD.rank + 1))
    dist.all_reduce(total, group=group)
    expected = float(sum(r + 1 for r in ranks))
    if not torch.equal(total, torch.full((3,), expected)):
        problems.append(f"{label}: {total.tolist()}, expected {expected}")


def main(method: str) -> None:
    problems: list[str] = []
    url = _init_method(method)
    kwargs = {} if method == "env" else {"rank": WORLD.rank, "world_size": WORLD.size}
    dist.init_process_group("collectives", init_method=url, timeout=TIMEOUT, **kwargs)
    everyone, last = list(range(WORLD.size)), WORLD.size - 1
    try:
        first = dist.new_group([0])  # the first group: rank 0 alone
        _summed([0], first, problems, "the first group, [0]")
        _summed(everyone, None, problems, "the world after the first group")
        later = {
            "[last]": ([last], dist.new_group([last])),
            "every rank": (everyone, dist.new_group(everyone)),
            "[0] again": ([0], dist.new_group([0])),
        }
        for label, (ranks, group) in later.items():
            _summed(ranks, group, problems, f"the later group {label}")
        _summed(everyone, None, problems, "the world after the later groups")
    except Exception as error:
        problems.append(f"raised {type(error).__name__}: {error}")
    print("RESULT " + json.dumps({"rank": WORLD.rank, "problems": problems}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
