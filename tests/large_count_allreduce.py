"""Run by test_large_count.py under mpiexec -n 2: an int8 allreduce of 2**31 + 7 elements."""

import sys

import numpy as np
from mpi4py import MPI

import collectives

COUNT = 2**31 + 7  # past MPI's int count limit
SLICE = 1 << 26

world = MPI.COMM_WORLD
algorithm = sys.argv[1]
x = np.ones(COUNT, np.int8)
x[-7:] = np.arange(7, dtype=np.int8) + world.rank  # a tail that would show a truncated count
result = collectives.allreduce(x, algorithm=algorithm)
del x
good = result.shape == (COUNT,)
# compare in slices: a whole-array comparison would allocate another 2 GiB
for start in range(0, COUNT - 7, SLICE):
    good = good and bool((result[start : min(start + SLICE, COUNT - 7)] == 2).all())
good = good and result[-7:].tolist() == [2 * i + 1 for i in range(7)]
if not world.allreduce(good, op=MPI.LAND):
    print(f"rank {world.rank}: wrong result of {algorithm}", flush=True)
    sys.exit(1)
if world.rank == 0:
    print(f"{algorithm}: {COUNT} int8 elements reduced correctly", flush=True)
