"""Where a small allreduce's time goes, layer by layer: ``bench small_path`` under mpiexec.

Times, interleaved round by round, loops of in-place float32 sums of one size on
one node's shared memory, each adding one layer of the library to the one before:

* ``floor``: the copy into this rank's region, the shared-memory barrier and the
  reduction, called directly: what any implementation of the algorithm pays;
* ``compiled``: the same steps in one call into the compiled engine (where it is
  built and on: :mod:`collectives.engine`), with the barrier's bookkeeping;
* ``watchdog``: the floor with the call numbered, recorded, bounded and its
  signature posted and compared (``Watchdog.watch``, ``Call.barrier``, ``end``);
* ``executor``: the watchdog around ``SharedExecutor.allreduce`` with the backend;
* ``prepared``: the ready repeat of a call whose decisions an earlier one made
  (:mod:`collectives.repeats`; on shared memory, the lean path of :mod:`collectives.lean`);
* ``allreduce``: ``collectives.allreduce(x, out=x)`` itself (through ``dispatch.call_collective``
  to the same lean path);
* ``persistent``: ``p()`` of ``p = collectives.allreduce_init(x, out=x)`` (the lean path too);
* ``mpi``: the MPI library's ``comm.Allreduce`` in place, for scale.

It reaches into the library's private parts, as a profiler would; a row per
layer, the median of the rounds of the slowest rank. Only for sizes on the
one-barrier path (all ranks' inputs together within ``SMALL_TOTAL_BYTES``, or
``COMPILED_SMALL_READ_BYTES`` read in all where the compiled engine runs: ``small_bytes``).
"""

__all__ = ["interleaved_medians", "main"]

import argparse
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from mpi4py import MPI

import collectives
from collectives import engine
from collectives.backends.numpy_backend import UFUNCS, NumpyBackend
from collectives.ops import get_op
from collectives.shared_sizes import small_bytes

from .config import parse_size


def _layers(
    comm: collectives.Communicator, world: MPI.Intracomm, x: np.ndarray
) -> dict[str, Callable[[], None]]:
    """The loop bodies, by layer, for in-place sums of ``x`` on ``comm``."""
    for _ in range(100):  # the first calls decide and prepare; later ones reuse it
        collectives.allreduce(x, out=x, comm=comm)
    prepared = next(p for key, p in comm.repeats.items() if key[1] == x.shape)
    watchdog, executor = comm.watchdog, comm.shared
    shared = watchdog.shared
    if shared is None or executor is None or prepared.plan is not None:
        raise SystemExit("the ranks share no memory: the small shared-memory path does not run here")
    regions = [np.frombuffer(shared.region(r)[: x.nbytes], x.dtype) for r in range(comm.size)]
    mine = regions[comm.rank]
    backend, op = NumpyBackend(), get_op("sum")
    add = UFUNCS["sum"]

    def reduce_regions() -> None:
        add(regions[0], regions[1], out=x)
        for region in regions[2:]:
            add(x, region, out=x)

    def floor() -> None:
        np.copyto(mine, x)
        shared.arrive(())
        shared.wait()
        reduce_regions()

    def with_watchdog() -> None:
        call = watchdog.watch(prepared.guard, None, first_barrier=True)
        np.copyto(mine, x)
        call.barrier(shared)
        reduce_regions()
        watchdog.end(call)

    def with_executor() -> None:
        call = watchdog.watch(prepared.guard, None, first_barrier=True)
        executor.allreduce(backend, x, x, op, call.barrier)
        watchdog.end(call)

    halves = tuple(regions for _, regions in executor.small_views(backend, x))
    kernel = shared.small_kernel(halves, str(x.dtype), "sum", x.shape[0], 1.0)

    def compiled() -> None:
        turn = executor.turn
        executor.turn = turn ^ 1
        if kernel.run(turn, x, x, 0, None, 0):  # a rank was late
            shared.wait()
            kernel.reduce(turn, x)

    y = x.copy()
    return {
        "floor": floor,
        **({"compiled": compiled} if kernel is not None else {}),
        "watchdog": with_watchdog,
        "executor": with_executor,
        "prepared": lambda: prepared.run(comm, x, x, None),
        "allreduce": lambda: collectives.allreduce(x, out=x, comm=comm),
        "persistent": collectives.allreduce_init(x, out=x, comm=comm),
        "mpi": lambda: world.Allreduce(MPI.IN_PLACE, y),
    }


def interleaved_medians(
    world: MPI.Intracomm, bodies: dict[str, Callable[[], None]], rounds: int, calls: int
) -> dict[str, float]:
    """Seconds per call of each body, timed in turn ``rounds`` times: the slowest rank's median."""
    times: dict[str, list[float]] = {name: [] for name in bodies}
    for _ in range(rounds):
        for name, body in bodies.items():
            world.Barrier()
            start = time.perf_counter()
            for _ in range(calls):
                body()
            times[name].append((time.perf_counter() - start) / calls)
    return {name: world.allreduce(statistics.median(t), op=MPI.MAX) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench small_path", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--size", type=parse_size, default=8, help="bytes per rank (default 8)")
    parser.add_argument("-n", "--calls", type=int, default=1000, help="calls per loop (default 1000)")
    parser.add_argument("-r", "--rounds", type=int, default=12, help="rounds (default 12)")
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    largest = small_bytes(world.size, compiled=engine.COMPILED is not None)
    if world.size < 2 or args.size > largest:
        parser.error(f"needs 2 or more ranks and a size of at most {largest} bytes at {world.size} ranks")
    comm = collectives.Communicator(world)
    x = np.zeros(max(args.size // 4, 1), np.float32)  # zeros: repeated sums in place stay finite
    medians = interleaved_medians(world, _layers(comm, world, x), args.rounds, args.calls)
    if world.rank == 0:
        loops = f"{args.calls} calls x {args.rounds} rounds"
        print(f"# {world.size} ranks, {x.nbytes} B float32 sum in place, {loops}")
        mpi = medians["mpi"]
        for name, seconds in medians.items():
            print(f"{name:<10} {seconds * 1e6:7.2f} us  {seconds / mpi:5.2f}x mpi")
        sys.stdout.flush()
    comm.free()
    return 0


if __name__ == "__main__":
    sys.exit(main())
