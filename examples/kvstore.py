import numpy as np

import collectives.kvstore as kvstore

with kvstore.create("sync") as kv:  # every rank a worker and a server; BSP rounds
    kv.init("w", np.zeros(1000, np.float32))  # worker 0's value wins
    kv.set_optimizer(kvstore.SGD(lr=0.5))  # runs on the servers, on their partitions
    for _ in range(10):
        gradient = np.full(1000, kv.rank + 1, np.float32)
        w = kv.pushpull("w", gradient)  # push this worker's gradient, pull the updated parameters
    if kv.rank == 0:
        print(f"{kv.num_workers} workers, w[:3] = {w[:3]}")  # -0.5 * 10 steps * (1 + 2 + ...)
        print(kv.explain("w"))
