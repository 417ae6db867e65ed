"""The command line: ``mpiexec -n 4 python -m bench allreduce -b 8 -e 64M -a ring,mpi``.

Every collective has a sub-command; the barrier's table has one row, its latency.
"""

__all__ = ["main"]

import argparse
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

from mpi4py import MPI

from collectives.algorithms import build_schedule
from collectives.errors import CollectivesError, UnknownAlgorithmError
from collectives.ops import DTYPES, OPS, get_op
from collectives.specs import get_spec

from .collective import COLLECTIVES, library_version, run
from .config import MPI_ALGORITHM, Settings, default_algorithm, parse_size, size_sweep
from .report import to_json, total_wrong


def _size(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _options() -> argparse.ArgumentParser:
    """The options every collective's sub-command takes."""
    options = argparse.ArgumentParser(add_help=False)
    add = options.add_argument
    add("-b", "--minbytes", type=_size, default="8", help="smallest size, e.g. 8, 1K (default 8)")
    add("-e", "--maxbytes", type=_size, default="64M", help="largest size (default 64M)")
    add("-f", "--stepfactor", type=int, default=2, help="size multiplier per step (default 2)")
    add(
        "-d",
        "--datatype",
        choices=DTYPES,
        default="float32",
        metavar="DTYPE",
        help=f"element type: {', '.join(DTYPES)} (default float32)",
    )
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
        help=f"comma-separated algorithms; {MPI_ALGORITHM} is the MPI library's own "
        "(default: the API's, e.g. ring for allreduce)",
    )
    add("-n", "--iters", type=int, default=20, help="timed iterations (default 20)")
    add("-w", "--warmup", type=int, default=5, help="untimed warmup iterations (default 5)")
    add("-c", "--check", type=int, choices=(0, 1), default=1, help="count wrong elements (default 1)")
    add("--json", type=Path, metavar="PATH", help="also save every row, with metadata, as JSON")
    return options


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Time the collectives under mpiexec and print an nccl-tests style table.",
    )
    commands = parser.add_subparsers(dest="collective", required=True, metavar="collective")
    options = _options()
    for name in COLLECTIVES:
        commands.add_parser(name, parents=[options], help=f"benchmark {name}")
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
            build_schedule(collective, name, 1, 0)
        except UnknownAlgorithmError as error:
            parser.error(f"{error}, or {MPI_ALGORITHM} for the MPI library's own")
        except (CollectivesError, ValueError):
            pass  # the name is known; one rank and no elements just do not suit it
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
        root=args.root if spec.rooted else None,
    )


def _printer(enabled: bool) -> Callable[[str], None]:
    """A line printer that prints only where ``enabled``, flushing so lines show as they come."""

    def emit(line: str) -> None:
        if enabled:
            print(line, flush=True)

    return emit


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark on every rank; rank 0 prints. The exit status is 1 if anything was wrong."""
    parser = _parser()
    args = parser.parse_args(argv)
    world = MPI.COMM_WORLD
    settings = _settings(parser, args, world.size)
    try:
        rows = run(settings, world, _printer(world.rank == 0))
    except Exception:
        # the other ranks would wait for this one forever
        traceback.print_exc()
        sys.stderr.flush()
        world.Abort(1)
        raise
    if args.json is not None and world.rank == 0:
        record = to_json(settings, world.size, library_version(), rows)
        args.json.write_text(json.dumps(record, indent=2) + "\n")
    return 1 if total_wrong(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
