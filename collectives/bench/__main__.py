"""The command line: ``mpiexec -n 4 python -m collectives bench allreduce -b 8 -e 64M -a ring,mpi``, and more.

Every collective has a sub-command (nccl-tests' table); the barrier's table has one row, its
latency. ``calibrate`` measures the cost model and saves it where ``auto`` reads it, so later
runs on this machine choose by it. The other sub-commands are the modules of this package, each
with options of its own (``python -m collectives bench NAME --help``): see :data:`TOOLS`. Those
that need no MPI (``simulate``, ``algorithms``, ``plans``, ``standing``, ``kernels``) run before
MPI is imported. In the repository, ``python -m bench ...`` runs the same.
"""

__all__ = ["main"]

import argparse
import importlib
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from collectives.calibration import CALIBRATION_ENV, calibration_path
from collectives.errors import UnknownAlgorithmError
from collectives.ops import DTYPES, OPS, get_op
from collectives.selector import AUTO, check_algorithm
from collectives.specs import get_spec

from .config import MPI_ALGORITHM, Settings, add_datatype, add_sweep, default_algorithm, size_sweep
from .report import to_json, total_wrong

if TYPE_CHECKING:
    from mpi4py import MPI

T = TypeVar("T")

PROG = "python -m collectives bench"

TOOLS = {
    "simulate": ("simulate", "predict times on a topology, without MPI"),
    "algorithms": ("algorithms", "docs/algorithms.md's tables, without MPI"),
    "plans": ("plans", "one rank's plan and explain at 4,096 ranks, without MPI"),
    "compare": ("compare", "allreduce against MPI's and gloo's, interleaved"),
    "floor": ("floor", "allreduce against the single-copy floor and MPI's, interleaved"),
    "standing": ("standing", "the README's table of auto against MPI, from a compare JSON file"),
    "kernels": ("kernel_bench", "GB/s of the CUDA reduction kernels on one GPU"),
    "kvstore": ("kvstore", "the key-value store beside allreduce"),
    "segments": ("segments", "allreduce time by segment size"),
    "memory": ("memory", "resident memory over many calls"),
    "small_path": ("small_path", "where a small allreduce's time goes, layer by layer"),
    "device_allreduce": ("device_allreduce", "CuPy arrays' allreduce against MPI's through host copies"),
    "checkpoint": ("checkpoint", "what an in-memory and a directory checkpoint cost"),
    "recovery": ("recovery", "time from a rank's death to the next step (Open MPI with ULFM)"),
    "guard_cost": ("guard_cost", "the cost of the mismatch check and the bounded waits"),
    "reproducible": ("reproducible", "reproducible=True against the default; the accumulator's rate"),
    "trace_cost": ("trace_cost", "what tracing costs a call: off, calls, steps, interleaved"),
    "trace_why": ("trace_why", "how long trace why takes on a large job's dumps, without MPI"),
}
"""The sub-commands with options of their own: name -> (module of this package, help)."""


def _options() -> argparse.ArgumentParser:
    """The options every collective's sub-command takes."""
    options = argparse.ArgumentParser(add_help=False)
    add_sweep(options, "8", "64M", 2)
    add_datatype(options, f"element type: {', '.join(DTYPES)} (default float32)")
    add = options.add_argument
    add(
        "-o",
        "--op",
        choices=tuple(OPS),
        default="sum",
        metavar="OP",
        help=f"reduction: {', '.join(OPS)} (default sum; collectives that do not reduce ignore it)",
    )
    add("-r", "--root", type=int, default=0, help="root of broadcast, reduce, gather, scatter (default 0)")
    add(
        "-a",
        "--algorithm",
        metavar="NAMES",
        help=f"comma-separated algorithms; {AUTO} lets the selector choose at each size, "
        f"{MPI_ALGORITHM} is the MPI library's own (default: the API's, {AUTO})",
    )
    add("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    add("-w", "--warmup", type=int, default=5, help="untimed warmup iterations (default 5)")
    add("-c", "--check", type=int, choices=(0, 1), default=1, help="count wrong elements (default 1)")
    add("--json", type=Path, metavar="PATH", help="also save every row, with metadata, as JSON")
    add("--explain", action="store_true", help="print the selector's predictions at each size")
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Time the collectives under mpiexec and print an nccl-tests style table.",
    )
    from .collective import COLLECTIVES  # imports MPI, which simulate does without

    commands = parser.add_subparsers(dest="collective", required=True, metavar="collective")
    options = _options()
    for name in COLLECTIVES:
        commands.add_parser(name, parents=[options], help=f"benchmark {name}")
    calibrate = commands.add_parser(
        "calibrate",
        help="measure the cost model's alpha, beta, gamma and barrier (needs 2 or more ranks)",
        description=f"Measure the selector's cost model on this machine at this world size and save it "
        f"where the selector reads it, beside those of other world sizes: ${CALIBRATION_ENV}, else the "
        f"user cache directory ({calibration_path()} here).",
    )
    calibrate.add_argument("--quick", action="store_true", help="fewer, smaller cases: seconds, rougher")
    calibrate.add_argument("-n", "--iters", type=int, default=20, help="timed calls per case (default 20)")
    calibrate.add_argument("-w", "--warmup", type=int, default=3, help="untimed calls first (default 3)")
    for name, (_, text) in TOOLS.items():
        commands.add_parser(name, add_help=False, help=text)
    return parser


def _algorithms(parser: argparse.ArgumentParser, collective: str, text: str) -> tuple[str, ...]:
    """The distinct algorithm names in ``text``; a parser error names an unknown one."""
    names = tuple(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    if not names:
        parser.error("-a/--algorithm needs at least one algorithm")
    for name in names:
        if name == MPI_ALGORITHM:
            continue
        try:
            check_algorithm(collective, name)
        except UnknownAlgorithmError as error:
            parser.error(f"{error}, or {MPI_ALGORITHM} for the MPI library's own")
    return names


def _settings(parser: argparse.ArgumentParser, args: argparse.Namespace, world_size: int) -> Settings:
    """The validated settings of the parsed arguments; a parser error otherwise."""
    if args.iters < 1 or args.warmup < 0:
        parser.error(f"need -n of at least 1 and -w of at least 0; got -n {args.iters} -w {args.warmup}")
    spec = get_spec(args.collective)
    if spec.rooted and not 0 <= args.root < world_size:
        parser.error(f"root {args.root} is not a rank: valid roots are 0..{world_size - 1}")
    try:
        sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
        # the barrier combines tokens, not data
        op = args.op if spec.reduces and spec.carries_data else None
        if op is not None:
            get_op(op).check_dtype(args.datatype)
    except ValueError as error:
        parser.error(str(error))
    return Settings(
        collective=args.collective,
        sizes=sizes,
        dtype=args.datatype,
        op=op,
        algorithms=_algorithms(parser, args.collective, args.algorithm or default_algorithm(args.collective)),
        iters=args.iters,
        warmup=args.warmup,
        check=bool(args.check),
        explain=args.explain,
        root=args.root if spec.rooted else None,
    )


def _printer(enabled: bool) -> Callable[[str], None]:
    """A line printer that prints only where ``enabled``, flushing so lines show as they come."""

    def emit(line: str) -> None:
        if enabled:
            print(line, flush=True)

    return emit


def _abort_on_error(world: "MPI.Intracomm", call: Callable[[], T]) -> T:
    """``call()``; if it raises on this rank, abort every rank, as the others would wait for it forever."""
    try:
        return call()
    except Exception:
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        raise


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on every rank; rank 0 prints. The exit status is 1 if anything was wrong."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["floor"]:
        from .compare import main as compare
        from .floor import DEFAULTS

        return compare([*DEFAULTS, *argv[1:]])
    if argv[:1] and argv[0] in TOOLS:
        module = importlib.import_module(f"{__package__}.{TOOLS[argv[0]][0]}")
        status: int = module.main(argv[1:])
        return status
    from mpi4py import MPI

    from .calibrate import calibrate
    from .collective import library_version, run

    parser = _parser()
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    emit = _printer(world.rank == 0)
    if args.collective == "calibrate":
        if world.size < 2:
            parser.error("calibrate times messages between ranks; run it under mpiexec -n 2 or more")
        if args.iters < 1 or args.warmup < 0:
            parser.error(f"need -n of at least 1 and -w of at least 0; got -n {args.iters} -w {args.warmup}")
        _abort_on_error(
            world, lambda: calibrate(world, emit, quick=args.quick, iters=args.iters, warmup=args.warmup)
        )
        return 0
    settings = _settings(parser, args, world.size)
    if world.size == 1:  # started without mpiexec, most likely: say so, not only a table of one rank
        print(
            f"bench: one rank, so nothing travels between ranks; to measure {args.collective} across "
            f"ranks, start it under mpiexec: mpiexec -n 4 {sys.executable} -m collectives bench "
            f"{args.collective}",
            file=sys.stderr,
        )
    rows = _abort_on_error(world, lambda: run(settings, world, emit))
    if args.json is not None and world.rank == 0:
        record = to_json(settings, world.size, library_version(), rows)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if total_wrong(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
