"""``bench plans``: one rank's plan and ``explain`` at thousands of ranks, timed and traced.

For each allreduce algorithm of :data:`ALGORITHMS_TIMED`, rank r's part is built from
its rank number (:func:`collectives.algorithms.rank_program`, memo cleared) and
timed, its peak of allocated memory taken by ``tracemalloc``; then the
executor's plan of that part (:func:`collectives.execute.program_plan`, what a
rank's first call builds before a byte moves: its messages, segments and
scratch), from the program, likewise; then ``collectives.explain`` is timed, its
memos cleared, as a first call would be. No MPI: the plan is built, not run.
"""

__all__ = ["ALGORITHMS_TIMED", "main", "measure", "measure_plan"]

import argparse
import sys
import time
import tracemalloc
from collections.abc import Sequence

import collectives
from collectives import algorithms, execute, selector

from .table import Column, Table

ALGORITHMS_TIMED = ("ring", "tree", "double_tree", "butterfly", "halving_doubling", "hierarchical")
"""The allreduces whose plans should build within 50 ms and 50 MB at 4,096 ranks."""


def measure(algorithm: str, world_size: int, count: int, rank: int) -> tuple[float, int, int]:
    """``(seconds, peak bytes, steps)`` of building ``rank``'s allreduce plan afresh.

    Timed and traced in separate builds, as tracing slows every allocation.
    """
    algorithms.clear_programs()
    start = time.perf_counter()
    program = algorithms.rank_program("allreduce", algorithm, world_size, count, rank=rank)
    elapsed = time.perf_counter() - start
    algorithms.clear_programs()
    tracemalloc.start()
    algorithms.rank_program("allreduce", algorithm, world_size, count, rank=rank)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    algorithms.clear_programs()
    return elapsed, peak, len(program.steps)


def measure_plan(algorithm: str, world_size: int, count: int, rank: int) -> tuple[float, int, int]:
    """``(seconds, peak bytes, messages)`` of building the executor's plan of ``rank``'s allreduce afresh.

    From the rank's program (built beforehand, not timed), as a first call of
    float32 elements plans it: 4 MiB segments, the input read apart from the result.
    """
    program = algorithms.rank_program("allreduce", algorithm, world_size, count, rank=rank)
    segment = execute.DEFAULT_SEGMENT_BYTES // 4
    execute.clear_plans()
    start = time.perf_counter()
    made = execute.program_plan(program, segment, True)
    elapsed = time.perf_counter() - start
    execute.clear_plans()
    tracemalloc.start()
    execute.program_plan(program, segment, True)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    execute.clear_plans()
    algorithms.clear_programs()
    return elapsed, peak, sum(len(step.recvs) + len(step.sends) for step in made.steps)


def _explain_seconds(world_size: int, count: int) -> float:
    selector.clear_traffic_counts()
    start = time.perf_counter()
    collectives.explain("allreduce", count, world_size=world_size)
    return time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m collectives bench plans", description=__doc__)
    parser.add_argument("-n", "--world-size", type=int, default=4096, help="ranks (default 4096)")
    parser.add_argument("-c", "--count", type=int, default=2**24, help="float32 elements (default 2**24)")
    parser.add_argument("-r", "--rank", type=int, default=None, help="the rank (default the middle one)")
    args = parser.parse_args(argv)
    rank = args.world_size // 2 if args.rank is None else args.rank
    print(f"allreduce of {args.count} elements over {args.world_size} ranks, rank {rank}'s plan")
    table = Table(
        [Column("algorithm", width=18, left=True), Column("steps"), Column("time(ms)", ".2f"),
         Column("peak(MB)", ".2f"), Column("messages"), Column("plan(ms)", ".2f"), Column("peak(MB)", ".2f")]
    )  # fmt: skip
    print(table.header())
    for name in ALGORITHMS_TIMED:
        seconds, peak, steps = measure(name, args.world_size, args.count, rank)
        planned, plan_peak, messages = measure_plan(name, args.world_size, args.count, rank)
        print(table.row(name, steps, seconds * 1e3, peak / 1e6, messages, planned * 1e3, plan_peak / 1e6))
    seconds = _explain_seconds(args.world_size, args.count)
    print(f"explain(allreduce, {args.count}, world_size={args.world_size}): {seconds * 1e3:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
