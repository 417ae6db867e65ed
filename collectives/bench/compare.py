"""``bench compare``: our allreduce against MPI's and gloo's, interleaved, in one launch.

Every round runs each contender once, each started together after a barrier,
so slow spells of a shared machine fall on all contenders alike; the order is
shuffled each round (alike on every rank), so none always follows the same
other (gloo's threads, for one, keep a core busy for a while after its call). A contender's time in a
round is its slowest rank's, per call of a batch: small messages are timed
``BATCH_BYTES / size`` calls at a time (up to ``MAX_BATCH``), so that the
barrier's uneven exit across ranks does not swamp a call of a few microseconds.
Per size the table gives the median times and, for each of ours against each
peer, the ratio of medians with the quartiles and range of the per-round ratios.
All calls are in place on float32 buffers of zeros (so repeated sums stay
finite); each contender's result is first checked once on exact integer inputs.
"""

__all__ = ["main"]

import argparse
import datetime
import json
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mpi4py import MPI

import collectives
from collectives.algorithms import ALGORITHMS
from collectives.algorithms.base import implements
from collectives.selector import AUTO
from collectives.specs import get_spec

from .collective import library_version, mpi_datatype
from .compare_report import SizeResult, format_table, machine, plot, ratio, to_json
from .config import add_datatype, add_sweep, plan_sizes, size_sweep
from .floor import CROSS_MEMORY, SHARED_WINDOW, Floor, cross_memory_error
from .patterns import ExactData, count_wrong, numpy_dtype
from .progress import progress

PEERS = ("mpi", "gloo", "floor")
BATCH_BYTES = 1 << 20
"""A batch of small-message calls moves about this many bytes (see :func:`calls_per_sample`)."""
MAX_BATCH = 200
_TORCH_DTYPES = ("float32", "float64", "float16", "int32", "int64", "uint8", "int8")


def _parser() -> argparse.ArgumentParser:
    ours = [AUTO, *(name for name, module in ALGORITHMS.items() if implements(module, "allreduce"))]
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench compare",
        description="Time our allreduce against the MPI library's (and gloo's) in one launch, interleaved.",
    )
    add_sweep(parser, "8", "64M")
    add_datatype(parser)
    add = parser.add_argument
    add("-a", "--algorithm", default=",".join(ours), help=f"ours, comma-separated (default {','.join(ours)})")
    add(
        "-p",
        "--peers",
        default=",".join(PEERS),
        help="peers: mpi, gloo, floor (default all three; gloo needs torch; floor: see bench floor --help)",
    )
    add("-n", "--iters", type=int, default=20, help="timed rounds per size (default 20)")
    add("-w", "--warmup", type=int, default=3, help="untimed calls of each contender per size (default 3)")
    add("--alloc", action="store_true", help="our buffers from Communicator.alloc (shared memory, no copy)")
    add("--json", type=Path, metavar="PATH", help="save medians and ratios as JSON")
    add("--plot", type=Path, metavar="PNG", help="draw bus bandwidth against size")
    return parser


def _gloo(world: MPI.Intracomm) -> Any:
    """torch.distributed's gloo over the same ranks, the address shared through MPI; None without torch."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    port = 0
    if world.rank == 0:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
    port = world.bcast(port, root=0)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.rank, world_size=world.size
    )
    return dist


def _caller(
    name: str, x: np.ndarray, comm: collectives.Communicator, world: MPI.Intracomm, dist: Any
) -> Callable[[], object]:
    """One in-place allreduce of ``x`` by contender ``name``."""
    if name == "mpi":
        spec = [x.view(np.uint8), mpi_datatype(str(x.dtype))]
        return lambda: world.Allreduce(MPI.IN_PLACE, spec, op=MPI.SUM)
    if name == "floor":
        return Floor(x, world)
    if name == "gloo":
        import torch

        tensor = torch.from_numpy(x)
        return lambda: dist.all_reduce(tensor)
    return lambda: collectives.allreduce(x, "sum", out=x, algorithm=name, comm=comm)


def main(argv: list[str]) -> int:
    """Run the comparison on every rank; rank 0 prints and writes. Exit status 1 if anything was wrong."""
    parser = _parser()
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"need -n of at least 1 and -w of at least 0; got -n {args.iters} -w {args.warmup}")
    ours = tuple(dict.fromkeys(n.strip() for n in args.algorithm.split(",") if n.strip()))
    for name in ours:
        if name != AUTO and not implements(ALGORITHMS.get(name), "allreduce"):
            parser.error(f"unknown algorithm {name!r} for allreduce")
    peers = tuple(dict.fromkeys(n.strip() for n in args.peers.split(",") if n.strip()))
    if any(p not in PEERS for p in peers):
        parser.error(f"peers are {', '.join(PEERS)}; got {args.peers}")
    try:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    except ValueError as error:
        parser.error(str(error))
    notes = []
    dist = None
    if "gloo" in peers:
        dist = _gloo(world) if args.datatype in _TORCH_DTYPES else None
        if dist is None:
            notes.append("gloo skipped: no torch, or a dtype gloo lacks")
            peers = tuple(p for p in peers if p != "gloo")
    if "mpi" in peers and mpi_datatype(args.datatype) is None:
        notes.append(f"mpi skipped: no {args.datatype} datatype")
        peers = tuple(p for p in peers if p != "mpi")

    def emit(line: str) -> None:
        if world.rank == 0:
            print(line, flush=True)

    emit(f"# collectives allreduce compare, {world.size} ranks, {args.datatype} sum, in place")
    emit(f"# MPI library : {library_version()}")
    emit(f"# rounds      : {args.iters} interleaved after {args.warmup} warmup calls each")
    emit(f"# batches     : up to {MAX_BATCH} calls timed as one sample, 1 from {BATCH_BYTES} B up")
    if args.alloc:
        emit("# buffers     : ours from Communicator.alloc")
    if "floor" in peers:
        why = cross_memory_error(world)
        methods = (
            f"the faster of {CROSS_MEMORY} and {SHARED_WINDOW}" if why is None else f"{SHARED_WINDOW} ({why})"
        )
        emit(f"# floor       : {methods}, at each size")
    for note in notes:
        emit(f"# {note}")
    contenders = (*ours, *peers)
    dtype = numpy_dtype(args.datatype)
    data = ExactData.of("allreduce", "sum", args.datatype, world.size)
    factor = get_spec("allreduce").busbw_factor(world.size)
    comm = collectives.Communicator(world)
    results: list[SizeResult] = []
    try:
        planned = plan_sizes("allreduce", sizes, dtype.itemsize, world.size)
        for size, count in progress(planned, len(planned), "sizes", shown=world.rank == 0):
            results.append(
                _measure(args, world, comm, dist, contenders, ours, peers, size, count, data, factor)
            )
            for line in format_table(results[-1:], ours, peers)[(1 if len(results) > 1 else 0) :]:
                emit(line)
            if results[-1].floor is not None:
                emit(f"# floor at {size} B: {results[-1].floor}")
    finally:
        comm.free()
        if dist is not None:
            dist.destroy_process_group()
    wrong = sum(sum(r.wrong.values()) for r in results)
    emit(f"# wrong elements: {wrong} {'OK' if wrong == 0 else 'FAILED'}")
    if world.rank == 0:
        metadata = {
            "world_size": world.size, "dtype": args.datatype, "op": "sum", "in_place": True,
            "mpi_library_version": library_version(), "iters": args.iters, "warmup": args.warmup,
            "ours": list(ours), "peers": list(peers), "alloc": args.alloc,
            "date": datetime.date.today().isoformat(), "machine": machine(),
        }  # fmt: skip
        if args.json is not None:
            args.json.write_text(json.dumps(to_json(results, metadata), indent=2) + "\n")
        if args.plot is not None:
            title = f"allreduce {args.datatype}, {world.size} ranks ({library_version()})"
            plot(results, contenders, title, args.plot)
    return 1 if wrong else 0


def calls_per_sample(size: int) -> int:
    """Calls timed together as one sample at ``size`` bytes: 1 from ``BATCH_BYTES`` up."""
    return max(1, min(MAX_BATCH, BATCH_BYTES // max(size, 1)))


def _measure(
    args: argparse.Namespace,
    world: MPI.Intracomm,
    comm: collectives.Communicator,
    dist: Any,
    contenders: tuple[str, ...],
    ours: tuple[str, ...],
    peers: tuple[str, ...],
    size: int,
    count: int,
    data: ExactData,
    factor: float,
) -> SizeResult:
    """Check, warm up and time every contender at one size, interleaved; collective."""
    source = data.rank_input(world.rank, count)
    expected = data.expected(world.rank, count)
    buffers = {
        name: comm.alloc(count, source.dtype)
        if args.alloc and name in ours
        else np.empty(count, source.dtype)
        for name in contenders
    }
    calls = {name: _caller(name, buffers[name], comm, world, dist) for name in contenders}
    wrong = {}
    for name in contenders:
        np.copyto(buffers[name], source)
        calls[name]()
        mine = 0 if expected is None else count_wrong(buffers[name], expected)  # allreduce: never None
        wrong[name] = int(world.allreduce(mine, op=MPI.SUM))
        buffers[name].fill(0)
        for _ in range(args.warmup):
            calls[name]()
    times = np.empty((len(contenders), args.iters))
    batch = calls_per_sample(size)
    orders = np.random.default_rng(size)  # the same shuffles on every rank
    for i in range(args.iters):
        for j in orders.permutation(len(contenders)):
            call = calls[contenders[j]]
            world.Barrier()
            start = MPI.Wtime()
            for _ in range(batch):
                call()
            times[j, i] = (MPI.Wtime() - start) / batch
    world.Allreduce(MPI.IN_PLACE, times, op=MPI.MAX)
    floor = calls.get("floor")
    if isinstance(floor, Floor):
        floor.free()
    medians = {name: float(np.median(times[j])) for j, name in enumerate(contenders)}
    index = {name: j for j, name in enumerate(contenders)}
    ratios = {(a, b): ratio(list(times[index[a]]), list(times[index[b]])) for a in ours for b in peers}
    chosen = None
    if AUTO in ours:
        chosen = collectives.explain("allreduce", count, args.datatype, comm=comm).choice
    return SizeResult(
        size=size,
        count=count,
        times_us={name: t * 1e6 for name, t in medians.items()},
        busbw={name: size / t / 1e9 * factor if t > 0 else 0.0 for name, t in medians.items()},
        chosen=chosen,
        ratios=ratios,
        wrong=wrong,
        floor=floor.method if isinstance(floor, Floor) else None,
    )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
