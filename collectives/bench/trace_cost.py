"""What tracing costs a call: ``mpiexec -n 2 python -m collectives bench trace_cost`` (off, calls, steps).

Times loops of in-place float32 sum allreduces (plain calls, which repeat on the
lean path, and a persistent call's ``p()``) with tracing off, at the call level
and at the step level, the modes taking turns round by round in one launch so
that a busy machine slows them alike. ``+write`` rows add the time to write the
loop's records to the rank's file (done off the call's path: at exit, at a
timeout, on demand, or by the writer thread when the buffer is half full).
The median of the rounds of the slowest rank; ratios to tracing off.
"""

__all__ = ["main"]

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import collectives
from collectives.tracing import TRACER

from .config import parse_size


def _timed(world: MPI.Intracomm, body: Callable[[], object], calls: int, mode: str, folder: str) -> float:
    """Seconds per call of ``body`` with tracing in ``mode`` (``off``, ``calls``, ``steps``, ``+write``)."""
    on = mode != "off"
    if on:
        TRACER.start(folder, steps=mode.startswith("steps"))
    world.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        body()
    if mode.endswith("+write"):
        TRACER.flush()
    took = (time.perf_counter() - start) / calls
    if on:
        TRACER.stop()  # writes the records, outside the timed loop
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench trace_cost", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size", type=parse_size, default=8, help="bytes per rank (default 8)")
    parser.add_argument("--algorithm", default="auto", help="the allreduce's algorithm (default auto)")
    parser.add_argument("-n", "--calls", type=int, default=2000, help="calls per loop (default 2000)")
    parser.add_argument("-r", "--rounds", type=int, default=12, help="rounds (default 12)")
    parser.add_argument("--steps", action="store_true", help="time the step level too")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    comm = collectives.Communicator(world)
    x = np.zeros(max(args.size // 4, 1), np.float32)  # zeros: repeated sums in place stay finite
    for _ in range(50):
        collectives.allreduce(x, out=x, comm=comm, algorithm=args.algorithm)
    persistent = collectives.allreduce_init(x, out=x, comm=comm, algorithm=args.algorithm)
    bodies: dict[str, Callable[[], object]] = {
        "allreduce": lambda: collectives.allreduce(x, out=x, comm=comm, algorithm=args.algorithm),
        "persistent": persistent,
    }
    modes = ["off", "calls", "calls+write"] + (["steps", "steps+write"] if args.steps else [])
    times: dict[tuple[str, str], list[float]] = {(b, m): [] for b in bodies for m in modes}
    with tempfile.TemporaryDirectory() as folder:
        for round_ in range(args.rounds):
            for name, body in bodies.items():
                for mode in modes:  # a folder each, so a flush writes this loop's records only
                    place = f"{folder}/{round_}-{name}-{mode}"
                    times[name, mode].append(_timed(world, body, args.calls, mode, place))
    medians = {key: world.allreduce(statistics.median(t), op=MPI.MAX) for key, t in times.items()}
    if world.rank == 0:
        print(
            f"# {world.size} ranks, {x.nbytes} B float32 sum in place, algorithm {args.algorithm}, "
            f"{args.calls} calls x {args.rounds} rounds"
        )
        for name in bodies:
            off = medians[name, "off"]
            for mode in modes:
                seconds = medians[name, mode]
                print(f"{name:<11} {mode:<12} {seconds * 1e6:9.2f} us  {seconds / off:5.3f}x off")
        sys.stdout.flush()
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
