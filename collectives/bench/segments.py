"""Allreduce time by segment size: ``mpiexec -n 2 python -m collectives bench segments``.

Times one algorithm's in-place float32 allreduce with each segment size (the
executor's pipelining piece, see ``collectives.execute.DEFAULT_SEGMENT_BYTES``),
in rounds whose order is shuffled alike on every rank, and prints per message
size the median time of each and its ratio to the current default. A
communicator per segment size keeps each one's cached plans apart.
"""

__all__ = ["main"]

import argparse
import sys

import numpy as np
from mpi4py import MPI

import collectives
import collectives.early_plan as early_plan

from .config import parse_size

WHOLE = 1 << 40
"""A segment larger than any message: each message goes whole."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench segments", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-a", "--algorithm", default="ring")
    parser.add_argument("--segments", default="32K,256K,1M,4M,whole", help="segment sizes to compare")
    parser.add_argument("--sizes", default="1M,4M,16M,64M", help="message sizes")
    parser.add_argument("-n", "--iters", type=int, default=15, help="rounds per message size")
    args = parser.parse_args(argv)
    segments = [WHOLE if s == "whole" else parse_size(s) for s in args.segments.split(",")]
    world = MPI.COMM_WORLD
    default = early_plan.DEFAULT_SEGMENT_BYTES  # type: ignore[attr-defined]
    comms = {s: collectives.Communicator(world) for s in segments}
    try:
        for size in (parse_size(s) for s in args.sizes.split(",")):
            x = np.zeros(max(size // 4, 1), np.float32)
            times: dict[int, list[float]] = {s: [] for s in segments}

            def call(segment: int, x: np.ndarray = x) -> None:
                early_plan.DEFAULT_SEGMENT_BYTES = segment  # type: ignore[attr-defined]
                collectives.allreduce(x, out=x, algorithm=args.algorithm, comm=comms[segment])

            for segment in segments:
                call(segment)
                call(segment)
            orders = np.random.default_rng(size)
            for _ in range(args.iters):
                for j in orders.permutation(len(segments)):
                    world.Barrier()
                    start = MPI.Wtime()
                    call(segments[j])
                    times[segments[j]].append(world.allreduce(MPI.Wtime() - start, op=MPI.MAX))
            if world.rank == 0:
                medians = {s: float(np.median(t)) for s, t in times.items()}
                base = medians.get(default)
                cells = []
                for s, median in medians.items():
                    name = "whole" if s == WHOLE else f"{s >> 10}K"
                    versus = "" if base is None else f" ({median / base:.2f})"
                    cells.append(f"{name} {median * 1e3:.2f} ms{versus}")
                print(f"{size:>10} B  {args.algorithm}  " + "  ".join(cells), flush=True)
    finally:
        early_plan.DEFAULT_SEGMENT_BYTES = default  # type: ignore[attr-defined]
        for comm in comms.values():
            comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
