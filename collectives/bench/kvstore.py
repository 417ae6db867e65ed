"""``bench kvstore``: the key-value store's push, pull and pushpull beside allreduce of its bytes.

For each number of servers (colocated: every rank a server; ``k``: the last k
ranks dedicated servers) and each mode, a store over ``MPI.COMM_WORLD`` is made
and, per size, one float32 key of that many bytes. In ``sync`` mode over
colocated servers two stores are made, the default that runs push and pull as
collectives and one with ``collective=False`` that sends messages, and each size
gives a row of each (the ``path`` column), side by side. Each timed iteration runs,
one after the other and each started together after a barrier of the workers:
``collectives.allreduce`` of the same bytes over the workers, ``push``,
``pull``, ``push`` then ``pull`` (two calls: a step's latency), and
``pushpull``. A call's time is the slowest worker's, per call of a batch (small
sizes are timed ``BATCH_BYTES / size`` calls at a time, up to ``MAX_BATCH``); the
table gives the median over the iterations and the ratios of the medians to the
allreduce's. GB/s is the key's bytes over the time. Every value pushed while
timing is zeros, so sums stay finite in every mode; each size is first checked
once on exact integers (each worker pushes ``rank + 1``; the pull must be the sum), before
``--optimizer`` (if any) is set on the servers for the timed calls.
In ``ssp`` every worker calls ``clock()`` after each iteration, untimed.
"""

__all__ = ["main"]

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import cast

import numpy as np
from mpi4py import MPI

import collectives
from collectives import kvstore

from .collective import library_version
from .config import add_sweep, size_sweep
from .progress import Countdown

BATCH_BYTES = 1 << 20
MAX_BATCH = 50
COLUMNS = ("allreduce", "push", "pull", "push+pull", "pushpull")
_TITLES = (("size", 12), ("count", 11), ("mode", 5), ("servers", 9), ("path", 10))
PATHS = {True: "collective", False: "messages"}
"""A store's ``collective=`` argument, by the name its rows carry."""
_TIMES = tuple((f"{name}(us)", 13) for name in COLUMNS)
_RATES = (("pushpull(GB/s)", 14), ("allreduce(GB/s)", 15), ("pushpull/ar", 11), ("push+pull/ar", 12))


@dataclass(frozen=True)
class StoreTiming:
    """One size of one store: the median microseconds of each column, and the check's wrong elements."""

    size: int
    count: int
    mode: str
    servers: str
    times_us: dict[str, float]
    wrong: int
    path: str = "messages"

    def ratio(self, column: str) -> float:
        base = self.times_us["allreduce"]
        return self.times_us[column] / base if base > 0 else float("inf")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m collectives bench kvstore",
        description="Time the key-value store's push, pull and pushpull beside allreduce of the same bytes.",
    )
    add_sweep(parser, "4K", "64M")
    add = parser.add_argument
    add("-m", "--modes", default=",".join(kvstore.MODES), help="comma-separated (default all)")
    add("-s", "--servers", default="colocated,1", help="colocated, dedicated counts (default colocated,1)")
    add("--staleness", type=int, default=2, help="ssp's bound (default 2)")
    add(
        "--optimizer",
        choices=("none", "sgd", "adam"),
        default="none",
        help="run this optimizer on the servers (after each size's check; default none)",
    )
    add("-n", "--iters", type=int, default=10, help="timed iterations per size (default 10)")
    add("-w", "--warmup", type=int, default=2, help="untimed iterations first (default 2)")
    add("--json", type=Path, metavar="PATH", help="also save every row as JSON")
    return parser


def _servers(parser: argparse.ArgumentParser, text: str, world_size: int) -> list[int | None]:
    chosen: list[int | None] = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        if item == "colocated":
            chosen.append(None)
        elif item.isdigit() and 0 < int(item) < world_size:
            chosen.append(int(item))
        else:
            parser.error(f"servers {item!r}: 'colocated' or a count from 1 to {world_size - 1}")
    return chosen


def _calls(size: int) -> int:
    return max(1, min(MAX_BATCH, BATCH_BYTES // max(size, 1)))


def _timed(workers: MPI.Intracomm, call: Callable[[], object], calls: int) -> float:
    """Seconds per call of ``calls`` calls, the slowest worker's; all start after a barrier.

    The slowest is found by a buffer ``Allreduce``: mpi4py's pickle-based ``allreduce``
    holds the interpreter lock while it waits, so a worker done first would starve its
    rank's server thread, which the others' calls still need (measured: the other
    thread ran about 100 times in 1.4 s, not 10,000; runs of this table took minutes).
    """
    workers.Barrier()
    start = time.perf_counter()
    for _ in range(calls):
        call()
    took, slowest = np.array([(time.perf_counter() - start) / calls]), np.empty(1)
    workers.Allreduce(took, slowest, op=MPI.MAX)
    return float(slowest[0])


def _weight(size: int) -> float:
    """A row's expected cost beside others': its calls, each a fixed cost plus its bytes (64 KiB alike)."""
    return _calls(size) * (1 + size / 65536)


def _check(kv: kvstore.KVStore, key: str, count: int) -> int:
    """Wrong elements of a pull after every worker pushed ``rank + 1`` to a fresh key of zeros."""
    kv.init(key, np.zeros(count, np.float32))
    kv.push(key, np.full(count, kv.rank + 1, np.float32))
    kv.barrier()
    expected = kv.num_workers * (kv.num_workers + 1) // 2
    return int(np.count_nonzero(kv.pull(key) != expected))


def _measure(
    kv: kvstore.KVStore,
    workers: MPI.Intracomm,
    communicator: collectives.Communicator,
    size: int,
    iters: int,
    warmup: int,
) -> dict[str, float]:
    count = size // 4
    key = f"bench{size}"
    value, out, reduced = (np.zeros(count, np.float32) for _ in range(3))
    kv.init(key, value)
    calls: dict[str, Callable[[], object]] = {
        "allreduce": lambda: collectives.allreduce(value, out=reduced, comm=communicator),
        "push": lambda: kv.push(key, value),
        "pull": lambda: kv.pull(key, out=out),
        "push+pull": lambda: (kv.push(key, value), kv.pull(key, out=out)),
        "pushpull": lambda: kv.pushpull(key, value, out=out),
    }
    samples: dict[str, list[float]] = {name: [] for name in COLUMNS}
    batch = _calls(size)
    for iteration in range(warmup + iters):
        for name in COLUMNS:
            seconds = _timed(workers, calls[name], batch)
            if iteration >= warmup:
                samples[name].append(seconds * 1e6)
        if kv.mode == "ssp":
            kv.clock()
    return {name: statistics.median(values) for name, values in samples.items()}


def _header(
    args: argparse.Namespace, world_size: int, modes: list[str], servers: list[int | None]
) -> list[str]:
    def named(k: int | None) -> str:
        return "colocated" if k is None else f"{k} dedicated"

    keys = " ".join(title.rjust(width) for title, width in _TITLES)
    times = " ".join(title.rjust(width) for title, width in _TIMES)
    rates = " ".join(title.rjust(width) for title, width in _RATES)
    return [
        "# collectives kvstore benchmark",
        "#",
        f"# MPI library : {library_version()}",
        f"# world size  : {world_size}",
        "# dtype       : float32",
        f"# modes       : {', '.join(modes)}" + (f" (staleness {args.staleness})" if "ssp" in modes else ""),
        f"# servers     : {', '.join(named(k) for k in servers)}",
        f"# optimizer   : {args.optimizer} (on the servers)",
        f"# iterations  : {args.iters} timed after {args.warmup} warmup; the slowest worker's time, median",
        "#",
        f"#{keys} | {times} | {rates} | #wrong",
    ]


def format_row(row: StoreTiming) -> str:
    """A table line under :func:`_header`'s titles."""
    keys = [str(row.size), str(row.count), row.mode, row.servers, row.path]
    times = [f"{row.times_us[name]:.2f}" for name in COLUMNS]
    rates = [
        f"{row.size / row.times_us['pushpull'] / 1e3:.2f}",
        f"{row.size / row.times_us['allreduce'] / 1e3:.2f}",
        f"{row.ratio('pushpull'):.2f}x",
        f"{row.ratio('push+pull'):.2f}x",
    ]
    cells = [
        " ".join(v.rjust(w) for v, (_, w) in zip(keys, _TITLES, strict=True)),
        " ".join(v.rjust(w) for v, (_, w) in zip(times, _TIMES, strict=True)),
        " ".join(v.rjust(w) for v, (_, w) in zip(rates, _RATES, strict=True)),
        str(row.wrong).rjust(6),
    ]
    return " " + " | ".join(cells)


def main(argv: list[str] | None = None) -> int:
    """Run on every rank; rank 0 prints. The exit status is 1 if a check found a wrong element."""
    parser = _parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    world = MPI.COMM_WORLD
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in kvstore.MODES:
            parser.error(f"unknown mode {mode!r}; the modes are {', '.join(kvstore.MODES)}")
    servers = _servers(parser, args.servers, world.size)
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"need -n of at least 1 and -w of at least 0; got -n {args.iters} -w {args.warmup}")
    try:
        sizes = [s for s in size_sweep(args.minbytes, args.maxbytes, args.stepfactor) if s >= 4]
    except ValueError as error:
        parser.error(str(error))
    printing = world.rank == 0
    # the rows in order, weighed for the countdown: sync over colocated servers has two paths
    planned = [
        _weight(size)
        for k in servers
        for mode in modes
        for size in sizes
        for _ in range(2 if k is None and mode == "sync" else 1)
    ]
    if printing:
        header = _header(args, world.size, modes, servers)
        rows_line = f"# rows        : {len(planned)}, each printed as it is measured; the time left on stderr"
        print("\n".join([*header[:-2], rows_line, *header[-2:]]), flush=True)
    countdown = Countdown("bench kvstore", planned, shown=printing)
    rows: list[StoreTiming] = []
    for k in servers:
        for mode in modes:
            is_worker = k is None or world.rank < world.size - k  # dedicated servers are the last k
            # before create: servers serve in it
            workers = cast(MPI.Intracomm, world.Split(0 if is_worker else MPI.UNDEFINED))
            paths = (True, False) if k is None and mode == "sync" else (False,)
            stores = {
                path: kvstore.create(
                    mode, staleness=args.staleness if mode == "ssp" else 0, servers=k, collective=path
                )
                for path in paths
            }
            if not is_worker:  # a dedicated server: create returned once the workers closed
                continue
            communicator = collectives.Communicator(workers)
            wrongs = {
                path: [_check(kv, f"check{size}", size // 4) for size in sizes] for path, kv in stores.items()
            }
            if args.optimizer != "none":
                for kv in stores.values():
                    kv.set_optimizer(kvstore.SGD(momentum=0.9) if args.optimizer == "sgd" else kvstore.Adam())
            for index, size in enumerate(sizes):
                for path, kv in stores.items():  # the two paths' rows of a size side by side
                    times = _measure(kv, workers, communicator, size, args.iters, args.warmup)
                    label = "colocated" if k is None else str(k)
                    timing = StoreTiming(
                        size // 4 * 4, size // 4, mode, label, times, wrongs[path][index], PATHS[path]
                    )
                    rows.append(timing)
                    if printing:
                        print(format_row(rows[-1]), flush=True)
                    countdown.done()
            for kv in stores.values():
                kv.close()
            communicator.free()
            workers.Free()
    wrong = sum(row.wrong for row in rows)
    if printing:
        print(f"# Out of bounds values : {wrong} {'OK' if wrong == 0 else 'FAILED'}", flush=True)
        if args.json is not None:
            record = {"world_size": world.size, "library": library_version()}
            record["rows"] = [asdict(r) for r in rows]
            args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if world.allreduce(wrong, op=MPI.MAX) else 0
