"""Resident memory over many collectives: ``mpiexec -n 2 python -m collectives bench memory``.

Runs ``--calls`` allreduces per size on one communicator, samples each rank's
resident set size (RSS) every tenth of the run, and prints the samples of the
rank that grew most. The first tenth is warm-up (schedules, plans and scratch
are built then); growth is measured from its end to the last sample, so a
per-call leak shows as growth proportional to the calls, and a flat series as
growth near zero.
"""

__all__ = ["main", "resident_bytes"]

import argparse
import os
import sys

import numpy as np
from mpi4py import MPI

import collectives

from .config import parse_size

_PAGE = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident set size now (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE


def _series(comm: collectives.Communicator, nbytes: int, calls: int, algorithm: str) -> list[int]:
    """RSS after the warm-up tenth and after each further tenth of ``calls`` allreduces."""
    x = np.ones(max(nbytes // 4, 1), np.float32)
    out = np.empty_like(x)
    tenth = max(calls // 10, 1)
    samples = []
    for call in range(1, calls + 1):
        if call % 2:
            collectives.allreduce(x, out=out, algorithm=algorithm, comm=comm)
        else:
            # a new result array each time: the library must not hold on to it
            collectives.allreduce(x, algorithm=algorithm, comm=comm)
        if call % tenth == 0:
            samples.append(resident_bytes())
    return samples


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench memory", description=__doc__.splitlines()[0]
    )
    parser.add_argument("-n", "--calls", type=int, default=10_000, help="allreduces per size")
    parser.add_argument("--sizes", default="8,64K,1M", help="comma-separated message sizes")
    parser.add_argument("-a", "--algorithm", default="auto")
    parser.add_argument(
        "--max-growth-kib",
        type=float,
        default=None,
        help="exit 1 if any rank's RSS grows by more than this after the warm-up",
    )
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    comm = collectives.Communicator(world)
    worst = 0
    for size in args.sizes.split(","):
        nbytes = parse_size(size)
        samples = _series(comm, nbytes, args.calls, args.algorithm)
        growth = samples[-1] - samples[0]
        everyone = world.gather((growth, samples), root=0)
        worst = max(worst, world.allreduce(growth, op=MPI.MAX))
        if everyone is not None:  # rank 0
            growth, samples = max(everyone, key=lambda pair: pair[0])
            mib = " ".join(f"{s / 2**20:.2f}" for s in samples)
            print(
                f"{nbytes:>10} B  {args.calls} calls  {args.algorithm:<8} RSS MiB per tenth: {mib}"
                f"  growth after warm-up {growth / 1024:+.0f} KiB ({growth / max(args.calls, 1):+.1f} B/call)"
            )
            sys.stdout.flush()
    comm.free()
    if args.max_growth_kib is not None and worst > args.max_growth_kib * 1024:
        if world.rank == 0:
            bound = args.max_growth_kib
            print(f"RSS grew by {worst / 1024:.0f} KiB, more than {bound:g} KiB", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
