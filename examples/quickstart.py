import numpy as np

import collectives
from collectives.algorithms import build_schedule
from collectives.simulate import simulate

comm = collectives.Communicator()  # over MPI.COMM_WORLD
x = np.arange(12, dtype=np.float32) + comm.rank

total = collectives.allreduce(x)  # every rank gets the sum; the selector picks the algorithm
mine = collectives.reduce_scatter(x)  # rank r gets its 12 / P elements of the sum
everyone = collectives.allgather(np.array([comm.rank]))  # [0, 1, ..., P - 1]

if comm.rank == 0:
    print("allreduce:", total)
    print("allgather:", everyone)
    # the same ring, checked and counted in one process, no MPI involved
    result = simulate(build_schedule("allreduce", "ring", comm.size, x.size))
    print(f"{result.name}: {result.steps} steps, elements sent per rank {result.elements_sent}")
