"""``python -m collectives trace merge DIR -o job.json [--predict]`` and ``trace why DIR``."""

__all__ = ["main"]

import argparse
import json
import sys


def main(argv: list[str]) -> int:
    """Run ``trace merge`` or ``trace why`` on ``argv``; the exit status."""
    parser = argparse.ArgumentParser(prog="python -m collectives trace", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    merging = commands.add_parser("merge", help="every rank's trace file on one timeline, one track per rank")
    merging.add_argument("folder", help="the folder the ranks traced into ($COLLECTIVES_TRACE)")
    merging.add_argument("-o", "--output", required=True, help="the merged Chrome trace JSON to write")
    merging.add_argument(
        "--predict", action="store_true", help="add the cost model's time of each call and step beside it"
    )
    why = commands.add_parser("why", help="why the job hung: from the ranks' dumps (or traces), in words")
    why.add_argument("folder", help="the folder the ranks traced into ($COLLECTIVES_TRACE)")
    why.add_argument("--json", action="store_true", help="the verdict as JSON")
    args = parser.parse_args(argv)
    try:
        if args.command == "merge":
            from .merge import merge

            merged = merge(args.folder, predict=args.predict)
            with open(args.output, "w") as out:
                json.dump(merged, out, separators=(",", ":"))
            other = merged["otherData"]
            placed = ", ".join(f"rank {r}: {c['placed_by']}" for r, c in other["clock"].items())
            events, ranks = len(merged["traceEvents"]), len(other["ranks"])
            print(f"{events} events of {ranks} ranks -> {args.output} ({placed})")
            return 0
        from .why import diagnose, read_ranks, verdict_text

        verdict = diagnose(read_ranks(args.folder))
        if args.json:
            from dataclasses import asdict

            print(json.dumps(asdict(verdict), indent=1))
        else:
            print(verdict_text(verdict))
        return 0
    except (OSError, ValueError) as error:
        print(f"python -m collectives trace {args.command}: {error}", file=sys.stderr)
        return 1
